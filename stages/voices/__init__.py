"""Speaker encoders and their runtimes: the ``SpeakerEncoder`` interface with CAM++ (written from the paper
and its state dict) and SpeechBrain's ECAPA (``encoders``), used by the ``enrollment``, ``voice_profile``
and ``diarization`` stages; and a torch module exported once to ONNX and run by ONNX Runtime on the CPU,
checked against torch (``onnx_runtime``).
"""
