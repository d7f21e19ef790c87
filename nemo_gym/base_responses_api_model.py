"""NeMo Gym v0.2 import path for `SimpleResponsesAPIModel`, and v0.5's model-call capture names (`CaptureStore`,
`ModelCallCaptureConfig`, `ModelCallRecord`, `merge_model_call_capture_into_record`, ...); the code lives in
`nemo_gym.servers.model_server` and `nemo_gym.servers.model_call_capture`."""

from nemo_gym.servers.model_server import *  # noqa: F401,F403
from nemo_gym.servers import model_server as _model_server

__all__ = [*_model_server.__all__]
