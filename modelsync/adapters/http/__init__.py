"""The data plane: ranged GETs over lean HTTP/1.1 straight into files, with no S3 SDK on the way."""
