"""On-disk formats: LeRobot v2.1/v3.0 (metadata, frames, videos, images), its writer, and shards."""
