from consumers_sdk.testing.fake_client import RecordingClient, RecordingSyncClient

__all__ = ["RecordingClient", "RecordingSyncClient"]
