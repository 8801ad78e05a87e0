"""A real S3-compatible server on 127.0.0.1 (moto's threaded server), for the object-store tests.

The tests talk to it through the standard AWS environment variables, exactly as users point
raytrain_vla at AWS or MinIO; nothing in the client is mocked.
"""

from __future__ import annotations

import os
from pathlib import Path

BUCKET = "raytrain-vla-test"
_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")


class S3Server:
    """Start with `start()`, which sets the AWS variables in os.environ; `stop()` restores them."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._saved: dict[str, str | None] = {}

    def start(self) -> S3Server:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self._saved = {k: os.environ.get(k) for k in _ENV}
        os.environ.update(
            AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=f"http://{host}:{port}",
        )  # fmt: skip
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        return self

    def stop(self) -> None:
        self._server.stop()
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def upload(self, local: Path, name: str) -> str:
        """Copy a local directory to s3://BUCKET/name; returns that URI."""
        import s3fs

        fs = s3fs.S3FileSystem()
        uri = f"{BUCKET}/{name}"
        for path in sorted(Path(local).rglob("*")):
            if path.is_file():
                fs.put_file(str(path), f"{uri}/{path.relative_to(local).as_posix()}")
        fs.invalidate_cache()
        return f"s3://{uri}"
