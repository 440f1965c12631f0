"""The object stores a pull opens: the S3 SDK's control plane, and the data-plane store in front of it."""
