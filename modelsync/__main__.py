from modelsync.cli import main

main()
