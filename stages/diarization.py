"""Who spoke when: the pyannote pipeline through whisperx, or the embedded offline diarizer.

``model="auto"`` (the default) tries whisperx's ``DiarizationPipeline`` (pyannote
``speaker-diarization-community-1``) from a local path or the Hugging Face cache
(the hub only when allowed; ``HF_TOKEN`` from the environment), and when it is
not available falls back to the embedded diarizer, logs why and records it.

The embedded diarizer is built from real pretrained parts and a kept library:

1. **segmentation**: pyannote segmentation-3.0 (loaded with ``pyannote.audio``'s
   ``Model`` from its checkpoint file), run on 10 s windows every
   ``STEP_S`` seconds; each window gives frame-level activity of up to three
   *local* speakers;
2. **embeddings**: the CAM++ encoder (:mod:`stages.voices.encoders`) over each
   local speaker's non-overlapped speech in each window;
3. **clustering**: scipy's agglomerative clustering (average linkage, cosine
   distance) of those embeddings, cut at a distance threshold, or within
   ``min_speakers`` / ``max_speakers`` when set;
4. **reconstruction**: each global speaker's activity is the average of its
   local activities over the windows covering a frame; frames above 0.5 form
   its turns.

Each speaker's voice (the normalised mean of its clips' embeddings, which step 3
already has) is kept in the artifact (``voices``) for corpus speakers; the
pyannote pipeline's own speaker embeddings are kept the same way.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from contracts import Artifact, AudioArtifact, DiarizationArtifact, SpeakerTurn, StageRequest, WorkItem
from contracts.errors import ModelUnavailableError
from contracts.models import PYANNOTE_DEFAULT
from contracts.stage_settings import DiarizationSettings
from stages.runtime.base import Member, TorchStage, read_tracks
from stages.runtime.clock import model_time
from stages.runtime.memory import is_oom
from stages.runtime.weights import cached_name

log = logging.getLogger(__name__)

AUTO = "auto"
EMBEDDED = "embedded"
SAMPLE_RATE = 16000
#: hop between 10 s segmentation windows: each frame is seen by 4 windows
STEP_S = 2.5
#: clusters closer than this cosine distance (average linkage) are one speaker. Measured on the espeak
#: fixtures joined (three voices): merges within a voice happen at 0.01-0.19, the two female voices merge
#: at 0.45 and the male/female clusters at 0.68; real speech spreads a voice wider, hence not lower
CLUSTER_DISTANCE = 0.40
#: a local speaker needs this much non-overlapped speech in a window to be embedded
MIN_EMBED_S = 0.4
#: turns of one speaker separated by less than this are joined; shorter turns are dropped
MIN_GAP_S = 0.3
MIN_TURN_S = 0.15
#: local-speaker clips of several inputs are embedded together until this many batches' worth is collected
GROUP_BATCHES = 8


class DiarizationStage(TorchStage):
    name = "diarization"
    input = AudioArtifact
    input_key = "audio"
    output = DiarizationArtifact
    settings_model = DiarizationSettings

    def import_libraries(self) -> None:
        """numpy, torch, pyannote.audio (3.7 s of the child's start here) and the speaker encoder: imported
        before the request, so that a warm child's start hides them."""
        global np, torch
        import numpy as np
        import onnxruntime  # noqa: F401 - the embedded diarizer's runtime (DIARIZATION_RUNTIME=onnx)
        import pyannote.audio  # noqa: F401 - both diarizers' base
        import torch
        import whisperx.diarize  # noqa: F401 - the pyannote pipeline

        import stages.voices.encoders  # noqa: F401 - the embedded diarizer's CAM++

    def load(self, request: StageRequest, device: str) -> str:
        settings: DiarizationSettings = self.settings
        self.requested = settings.model
        self.min_speakers = settings.min_speakers
        self.max_speakers = settings.max_speakers
        self.fallback_reason = None
        self.pipeline = None
        if self.requested != EMBEDDED:
            name = PYANNOTE_DEFAULT if self.requested == AUTO else self.requested
            try:
                from whisperx.diarize import DiarizationPipeline

                # pyannote prints its "could not download ... gated" advice to stdout: the fallback below says
                # it in one line (and the run's console names the substitution), so keep it at debug level
                with contextlib.redirect_stdout(io.StringIO()) as said:
                    try:
                        self.pipeline = DiarizationPipeline(model_name=name, device=device)
                    finally:
                        if said.getvalue().strip():
                            log.debug("diarization: pyannote said: %s", " ".join(said.getvalue().split()))
                self.model_name = f"pyannote:{cached_name(name, 'config.yaml')}"
                return self.model_name
            except Exception as exc:
                if is_oom(exc):
                    raise
                self.fallback_reason = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                log.warning(
                    "diarization: pyannote pipeline %r is not available (%s); using the embedded diarizer",
                    name,
                    self.fallback_reason,
                )
        self.embedded = EmbeddedDiarizer(device, settings.weights_dir, self.batch_size, settings.runtime)
        self.model_name = self.embedded.name
        log.info("diarization: embedded diarizer runs %s", self.embedded.runtime)
        return self.model_name

    packs_items = True

    def process(self, item: WorkItem, audio: AudioArtifact, request: StageRequest) -> DiarizationArtifact:
        samples = self._samples(item, audio)
        voices: dict = {}
        if self.pipeline is not None:
            frame, vectors = self.pipeline(
                samples,
                min_speakers=self.min_speakers,
                max_speakers=self.max_speakers,
                return_embeddings=True,
            )
            # pyannote's frames run to the end of its last (zero-padded) window: its turns can end after
            # the audio, so they are cut where the audio ends, as the embedded diarizer's are
            seconds = samples.size / SAMPLE_RATE
            raw = [
                (float(r.start), min(float(r.end), seconds), str(r.speaker))
                for r in frame.itertuples()
                if float(r.start) < seconds
            ]
            voices = {str(k): np.asarray(v, np.float32) for k, v in (vectors or {}).items()}
        else:
            raw = self.embedded(samples, self.min_speakers, self.max_speakers, voices)
        return self._artifact(item, audio, raw, voices)

    def process_packed(
        self, entries: Iterator[tuple[WorkItem, Artifact | str]], request: StageRequest
    ) -> Iterator[tuple[WorkItem, Artifact | BaseException]]:
        """Embedded diarizer, two shared streams: the 10 s segmentation windows of successive inputs share
        batches until ``GROUP_BATCHES`` batches' worth is collected, then the local-speaker clips of those
        inputs are embedded the same way; clustering and turns stay per input. A failing shared batch is
        repeated input by input (:meth:`pack_groups`). The pyannote pipeline takes one input at a time."""
        if self.pipeline is not None:
            for item, audio in entries:
                self.mark_in_flight(request, [item.id], audio.duration_s)
                try:
                    yield item, self.process(item, audio, request)
                except Exception as exc:
                    if is_oom(exc):
                        raise
                    yield item, exc
            return
        embedded = self.embedded

        def windows(item: WorkItem, audio: AudioArtifact) -> Member:
            samples = self._samples(item, audio)
            return Member(item, embedded.windows(samples), audio.duration_s, (audio, samples))

        def segmented(member: Member, rows) -> _Segmented:
            audio, samples = member.data
            return _Segmented(audio, embedded.local(samples, rows))

        def clips(item: WorkItem, upstream: _Segmented | BaseException) -> Member:
            if isinstance(upstream, BaseException):
                raise upstream  # this input's segmentation failed: it fails alone, with that reason
            return Member(item, upstream.local.clips, upstream.duration_s, upstream)

        def finish(member: Member, rows) -> DiarizationArtifact:
            audio, local = member.data.audio, member.data.local
            voices: dict = {}
            return self._artifact(
                member.item,
                audio,
                embedded.finish(local, rows, self.min_speakers, self.max_speakers, voices),
                voices,
            )

        segments = self.pack_groups(
            request, entries, windows, compute=embedded.segment, finish=segmented, batches=GROUP_BATCHES
        )
        yield from self.pack_groups(
            request,
            segments,
            clips,
            compute=lambda parts: embedded.encoder.embed(parts, self.batch_size),
            finish=finish,
            batches=GROUP_BATCHES,
        )

    def _samples(self, item: WorkItem, audio: AudioArtifact):
        return read_tracks(item, audio)[None]

    def _artifact(
        self, item: WorkItem, audio: AudioArtifact, raw, voices: dict | None = None
    ) -> DiarizationArtifact:
        names = label_names(raw)
        kept = {}
        for key, vector in (voices or {}).items():
            norm = float(np.linalg.norm(vector))
            if key in names and norm > 0 and np.isfinite(norm):
                kept[names[key]] = [float(x) for x in np.asarray(vector, np.float64) / norm]
        encoder = (self.embedded.encoder.name if self.pipeline is None else self.model_name) if kept else None
        return DiarizationArtifact(
            item_id=item.id,
            fingerprint=item.fingerprint,
            source=audio.source,
            turns=relabel(raw),
            **self.provenance(),
            min_speakers=self.min_speakers,
            max_speakers=self.max_speakers,
            duration_s=audio.duration_s,
            voices=kept or None,
            voice_encoder=encoder,
        )

    def close(self) -> None:
        self.pipeline = self.embedded = None


def _kept(raw: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    return sorted((round(s, 3), round(e, 3), spk) for s, e, spk in raw if e - s > 1e-3)


def label_names(raw: list[tuple[float, float, str]]) -> dict[str, str]:
    """The diarizer's cluster names -> SPEAKER_00, SPEAKER_01, ... in order of first appearance."""
    names: dict[str, str] = {}
    for _, _, speaker in _kept(raw):
        names.setdefault(speaker, f"SPEAKER_{len(names):02d}")
    return names


def relabel(raw: list[tuple[float, float, str]]) -> list[SpeakerTurn]:
    """Sorted turns labelled SPEAKER_00, SPEAKER_01, ... in order of first appearance."""
    names = label_names(raw)
    return [SpeakerTurn(start=start, end=end, speaker=names[speaker]) for start, end, speaker in _kept(raw)]


class EmbeddedDiarizer:
    """pyannote segmentation-3.0 + CAM++ + scipy agglomerative clustering, all offline."""

    def __init__(self, device: str, weights_dir: str | None, batch_size: int, runtime: str = "onnx") -> None:
        """``runtime="onnx"``: both models in ONNX Runtime on the CPU (:mod:`stages.voices.onnx_runtime`; each one
        that cannot be had stays on torch, logged); "torch": the torch modules."""
        from pyannote.audio import Inference, Model
        from pyannote.audio.utils.reproducibility import fix_reproducibility

        from stages.runtime.weights import weight_path
        from stages.voices.encoders import CamPlusPlusEncoder

        path = weight_path("segmentation", weights_dir)
        try:
            model = Model.from_pretrained(path, strict=True)
        except Exception as exc:
            if is_oom(exc):
                raise
            raise ModelUnavailableError(f"cannot load segmentation model {path}: {exc}") from exc
        self.duration = float(model.specifications.duration)
        self.inference = Inference(
            model,
            window="sliding",
            duration=self.duration,
            step=STEP_S,
            skip_aggregation=True,
            device=torch.device(device),
            batch_size=max(1, batch_size),
        )
        fix_reproducibility(torch.device(device))  # what Inference.__call__ does (no TF32 on CUDA)
        self.window_samples = model.audio.get_num_samples(self.duration)
        self.step_samples = round(STEP_S * SAMPLE_RATE)
        self.onnx = None
        if runtime == "onnx" and device == "cpu":
            from stages.voices.onnx_runtime import session

            probe = 0.1 * torch.randn(2, 1, self.window_samples, generator=torch.Generator().manual_seed(0))
            self.onnx = session(
                "segmentation", model.eval(), Path(path), probe, "waveforms", {0: "batch"}, tolerance=1e-3
            )
        self.encoder = CamPlusPlusEncoder(device, weight_path("campplus", weights_dir), runtime)
        self.runtime = f"segmentation {'onnx' if self.onnx else 'torch'}, embeddings {self.encoder.runtime}"
        self.batch_size = max(1, batch_size)
        self.name = f"{EMBEDDED}:pyannote-segmentation-3.0+campplus"

    def __call__(
        self,
        samples,
        min_speakers: int | None = None,
        max_speakers: int | None = None,
        voices: dict | None = None,
    ):
        """(start, end, cluster) for each turn of ``samples`` (16 kHz mono float32); ``voices`` (when given)
        gets each cluster's voice (:meth:`finish`)."""
        local = self.local(samples, self.segment(self.windows(samples)))
        return self.finish(
            local,
            self.encoder.embed(local.clips, self.batch_size) if local.clips else None,
            min_speakers,
            max_speakers,
            voices,
        )

    def windows(self, samples) -> list:
        """The 10 s windows of ``samples`` every ``STEP_S`` (views; the last one zero-padded), cut as
        pyannote's sliding ``Inference`` cuts them, so that windows of several inputs can share batches."""
        if samples.size < SAMPLE_RATE // 10:
            return []
        size, step = self.window_samples, self.step_samples
        complete = 1 + (samples.size - size) // step if samples.size >= size else 0
        cut = [samples[c * step : c * step + size] for c in range(complete)]
        if samples.size < size or (samples.size - size) % step:
            last = samples[complete * step :]
            cut.append(np.pad(last, (0, size - last.size)))
        return cut

    def segment(self, windows: list):
        """Frame activity (windows, frames, local speakers), 0/1, of ``windows`` in batches of ``batch_size``."""
        rows = []
        for start in range(0, len(windows), self.batch_size):
            batch = np.stack(windows[start : start + self.batch_size]).astype(np.float32, copy=False)
            rows.append(np.asarray(self.infer(torch.from_numpy(batch).unsqueeze(1)), dtype=np.float32))
        return np.concatenate(rows) if rows else np.zeros((0, 0, 0), np.float32)

    def infer(self, chunks):
        """Frame activity of a batch of windows (batch, 1, samples): pyannote's ``Inference.infer`` (the
        model, then powerset to multilabel), or the same conversion of ONNX Runtime's output."""
        with model_time():
            if self.onnx is None:
                return self.inference.infer(chunks)
            with torch.inference_mode():
                return self.inference.conversion(self.onnx(chunks)).numpy()

    def local(self, samples, activity) -> _Local:
        """The clips of the local speakers to embed (steps 1 and 2's input), from the ``activity`` of
        ``samples``' windows (:meth:`segment` of :meth:`windows`)."""
        if not len(activity):
            return _Local(samples.size / SAMPLE_RATE)
        chunks, frames, _ = activity.shape
        frame_s = self.duration / frames
        starts = [c * STEP_S for c in range(chunks)]

        keys, clips = [], []
        for c in range(chunks):
            alone = activity[c] * (activity[c].sum(axis=1, keepdims=True) == 1)  # non-overlapped frames
            for k in range(activity.shape[2]):
                mask = alone[:, k] if alone[:, k].sum() * frame_s >= MIN_EMBED_S else activity[c, :, k]
                if mask.sum() * frame_s < MIN_EMBED_S:
                    continue
                clip = _masked(samples, starts[c], frame_s, mask)
                if clip.size >= MIN_EMBED_S * SAMPLE_RATE:
                    keys.append((c, k))
                    clips.append(clip)
        return _Local(samples.size / SAMPLE_RATE, activity, starts, frame_s, keys, clips)

    def finish(
        self,
        local: _Local,
        embeddings,
        min_speakers: int | None = None,
        max_speakers: int | None = None,
        voices: dict | None = None,
    ):
        """Cluster the local speakers' ``embeddings`` (rows of ``local.clips``) and rebuild the turns.
        ``voices`` (when given) gets each cluster's voice: cluster name -> the mean of its embeddings."""
        if not local.clips:
            return []
        labels = cluster(embeddings, min_speakers, max_speakers)
        if voices is not None:
            rows = np.asarray(embeddings, np.float64)
            rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
            voices.update({f"C{s}": rows[labels == s].mean(axis=0) for s in range(int(labels.max()) + 1)})
        activity, starts, frame_s, keys = local.activity, local.starts, local.frame_s, local.keys
        chunks, frames, _ = activity.shape

        # reconstruction on a global frame grid
        total = int(np.ceil((starts[-1] + self.duration) / frame_s)) + 1
        speakers = int(labels.max()) + 1
        score = np.zeros((total, speakers), np.float32)
        count = np.zeros((total, 1), np.float32)
        for c in range(chunks):
            first = int(round(starts[c] / frame_s))
            count[first : first + frames] += 1
            local_score = np.zeros((frames, speakers), np.float32)
            for (cc, k), label in zip(keys, labels):
                if cc == c:
                    local_score[:, label] = np.maximum(local_score[:, label], activity[c, :, k])
            score[first : first + frames] += local_score
        active = score / np.maximum(count, 1) >= 0.5
        turns = []
        for s in range(speakers):
            for start, end in _runs(active[:, s], frame_s):
                turns.append((start, min(end, local.seconds), s))
        return [(s, e, f"C{spk}") for s, e, spk in turns if e - s >= MIN_TURN_S]


@dataclass(eq=False)
class _Segmented:
    """One input between the two shared streams: its audio artifact and its segmentation."""

    audio: AudioArtifact
    local: _Local

    @property
    def duration_s(self) -> float:
        return self.audio.duration_s


@dataclass(eq=False)
class _Local:
    """One input's segmentation: frame activity of each window's local speakers, and the clips to embed."""

    seconds: float
    activity: object = None
    starts: list = field(default_factory=list)
    frame_s: float = 0.0
    keys: list = field(default_factory=list)
    clips: list = field(default_factory=list)


def _masked(samples, start_s: float, frame_s: float, mask):
    """The samples of a window's frames where ``mask`` is on, concatenated."""
    idx = np.flatnonzero(mask > 0.5)
    pieces = []
    for run in np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1):
        a = int((start_s + run[0] * frame_s) * SAMPLE_RATE)
        b = int((start_s + (run[-1] + 1) * frame_s) * SAMPLE_RATE)
        pieces.append(samples[max(0, a) : max(0, min(b, samples.size))])
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def _runs(active, frame_s: float) -> list[tuple[float, float]]:
    """(start, end) seconds of runs of True, gaps shorter than MIN_GAP_S closed."""
    runs: list[list[float]] = []
    idx = np.flatnonzero(active)
    if idx.size == 0:
        return []
    for run in np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1):
        start, end = run[0] * frame_s, (run[-1] + 1) * frame_s
        if runs and start - runs[-1][1] < MIN_GAP_S:
            runs[-1][1] = end
        else:
            runs.append([start, end])
    return [(a, b) for a, b in runs]


def cluster(
    embeddings,
    min_speakers: int | None = None,
    max_speakers: int | None = None,
    distance: float = CLUSTER_DISTANCE,
):
    """Cluster labels 0..n-1 of L2-normalised ``embeddings`` (agglomerative, average linkage, cosine)."""
    from scipy.cluster.hierarchy import fcluster, linkage

    n = len(embeddings)
    if n == 1:
        return np.zeros(1, dtype=int)
    tree = linkage(np.asarray(embeddings, dtype=np.float64), method="average", metric="cosine")
    labels = fcluster(tree, t=distance, criterion="distance")
    found = len(set(labels))
    low, high = min_speakers or 1, min(max_speakers or n, n)
    if found < low or found > high:
        labels = fcluster(tree, t=min(max(found, low), high), criterion="maxclust")
    _, labels = np.unique(labels, return_inverse=True)
    return labels


STAGE = DiarizationStage()
