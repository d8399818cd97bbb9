"""The local S3 server of the tests: :class:`distfusion.testing.s3_server.S3Server`."""

from distfusion.testing.s3_server import S3Server

__all__ = ["S3Server"]
