"""whisperX ASR with the embedded Whisper tiny.en, loaded once for the module."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from contracts import AudioArtifact, StageRequest, TranscriptArtifact, WorkItem, load_artifact
from contracts.errors import ModelUnavailableError
from stages.asr import AsrStage
from stages.audio import STAGE as AUDIO
from stages.whisper.models import embedded_model_path, resolve_model
from tests.conftest import DIALOGUE_TEXT, MAX_WER, SPEECH_TEXT, normalise, stage_settings, wer

pytestmark = pytest.mark.slow


def _request(tmp_path, audio_json, batch_size=4, **settings) -> StageRequest:
    return StageRequest(
        request_id="r",
        stage="asr",
        module="stages.asr",
        batch_size=batch_size,
        device="cpu",
        settings=stage_settings("asr", **settings),
        result_path=str(tmp_path / "res.json"),
        items=[
            WorkItem(
                id="s",
                inputs={"audio": str(audio_json)},
                output=str(tmp_path / "transcript.json"),
                fingerprint="fp-asr",
            )
        ],
    )


@pytest.fixture(scope="module")
def audio_json(tmp_path_factory, media):
    tmp = tmp_path_factory.mktemp("audio")
    AUDIO.import_libraries()
    AUDIO.run(
        StageRequest(
            request_id="a",
            stage="audio",
            module="stages.audio",
            batch_size=1,
            result_path=str(tmp / "r.json"),
            settings=stage_settings("audio"),
            items=[
                WorkItem(
                    id="s",
                    inputs={"source": str(media / "speech.wav")},
                    output=str(tmp / "audio.json"),
                    fingerprint="fp",
                )
            ],
        )
    )
    return tmp / "audio.json"


def test_embedded_model_resolves_inside_its_wheel():
    path, english_only = resolve_model("embedded")
    assert path == str(embedded_model_path()) and english_only
    assert (embedded_model_path() / "model.bin").is_file()
    assert resolve_model("distil-large-v3") == ("distil-large-v3", False)


def test_transcribes_the_spoken_words_and_records_what_ran(tmp_path, audio_json):
    result = AsrStage().run(_request(tmp_path, audio_json, batch_size=4))
    assert result.items[0].ok, result.items[0].error
    transcript = load_artifact(tmp_path / "transcript.json", TranscriptArtifact)
    text = " ".join(s.text for s in transcript.segments)
    assert wer(SPEECH_TEXT, text) < MAX_WER, text
    assert transcript.model == "whisper tiny.en (embedded)" and transcript.requested_model == "embedded"
    assert (transcript.device, transcript.compute_type, transcript.batch_size) == ("cpu", "int8", 4)
    assert transcript.fingerprint == "fp-asr" and transcript.aligned is False and transcript.language == "en"
    assert 0 <= transcript.segments[0].start < transcript.segments[-1].end <= transcript.duration_s + 0.5
    assert result.load_s > 0 and result.compute_s > 0
    # the kernel's count of the compute: Whisper kept the CPU busy (no more than 2 threads' worth of it)
    cpu = result.compute_cpu
    assert 0.3 * result.compute_s < cpu.cpu_s < 2.5 * result.compute_s and cpu.minor_faults > 0, cpu


def test_words_are_timed_while_decoding_and_the_alignment_stage_then_runs_no_model(tmp_path, audio_json):
    """The ASR stage times each window's words over the encoder output it decoded; the alignment stage keeps
    them without loading a model, and they agree with its own second pass of the model (word_timestamps off)."""
    from stages.alignment import AlignmentStage

    def transcribe(tag, **settings):
        out = tmp_path / tag
        out.mkdir()
        result = AsrStage().run(_request(out, audio_json, **settings))
        assert result.items[0].ok, result.items[0].error
        asr = load_artifact(out / "transcript.json", TranscriptArtifact)
        item = WorkItem(
            id="s",
            inputs={"asr": str(out / "transcript.json"), "audio": str(audio_json)},
            output=str(out / "final.json"),
            fingerprint="fp-final",
        )
        stage = AlignmentStage()
        aligned = stage.run(
            StageRequest(
                request_id="r",
                stage="alignment",
                module="stages.alignment",
                batch_size=2,
                device="cpu",
                items=[item],
                result_path=str(out / "r.json"),
                settings=stage_settings("alignment", align=True, speakers=False),
            )
        )
        assert aligned.items[0].ok, aligned.items
        return asr, load_artifact(out / "final.json", TranscriptArtifact), stage

    asr, final, stage = transcribe("decode")
    assert asr.aligner == "whisper-cross-attention:embedded" and asr.aligned is False
    for seg in asr.segments:
        assert seg.words and " ".join(w.word for w in seg.words) == seg.text
        assert all(seg.start <= w.start <= w.end <= seg.end and 0 < w.score <= 1 for w in seg.words)
    assert final.aligned and final.aligner == "whisper-cross-attention:embedded"
    assert stage.whisper == {}, (
        "no Whisper model loaded by the alignment stage: the words came with the transcript"
    )

    plain, second, stage = transcribe("second-pass", word_timestamps=False)
    assert plain.aligner is None and all(s.words is None for s in plain.segments)
    assert second.aligned and stage.whisper, "without decode-time words the alignment stage runs the model"
    a = [w for s in final.segments for w in s.words]
    b = [w for s in second.segments for w in s.words]
    assert [w.word for w in a] == [w.word for w in b]
    gaps = sorted(abs(x.start - y.start) for x, y in zip(a, b))
    assert gaps[len(gaps) // 2] <= 0.04 and gaps[-1] <= 0.5, gaps


def test_a_failing_word_timing_leaves_the_transcript_standing(tmp_path, audio_json, monkeypatch):
    """Word timing is a bonus of the decode: if it fails (not out of memory), the input is still transcribed,
    its segments have no words, and the alignment stage will time them (tested above)."""
    import stages.whisper.align

    def broken(*args, **kwargs):
        raise RuntimeError("alignment heads missing")

    monkeypatch.setattr(stages.whisper.align, "timed_words", broken)
    result = AsrStage().run(_request(tmp_path, audio_json))
    assert result.items[0].ok, result.items[0].error
    transcript = load_artifact(tmp_path / "transcript.json", TranscriptArtifact)
    assert wer(SPEECH_TEXT, " ".join(s.text for s in transcript.segments)) < MAX_WER
    assert transcript.segments and all(s.words is None for s in transcript.segments)


#: a prompt in lower case without punctuation: Whisper writes what follows it in the same style
LOWER_CASE_PROMPT = (
    "hello and welcome i am going to talk about the fox and the dog and the sea shells and a shop"
)


def test_the_initial_prompt_reaches_the_decoder(tmp_path, audio_json):
    """ASR_PROMPT is Whisper's initial prompt, the text before every window: a prompt in lower case without
    punctuation gives a transcript in lower case without punctuation (unprompted: "... the sea shore. Please
    call Stella ...")."""
    check_initial_prompt(tmp_path, audio_json)


def check_initial_prompt(tmp_path, audio_json, **settings) -> TranscriptArtifact:
    """The assertions of the test above, with the stage's ``settings`` besides; returns the transcript."""
    result = AsrStage().run(_request(tmp_path, audio_json, prompt=LOWER_CASE_PROMPT, **settings))
    assert result.items[0].ok, result.items[0].error
    transcript = load_artifact(tmp_path / "transcript.json", TranscriptArtifact)
    text = " ".join(s.text for s in transcript.segments)
    assert wer(SPEECH_TEXT, text) < MAX_WER, text
    assert text == text.lower() and not set(".,?!") & set(text), text
    return transcript


def test_unavailable_model_is_a_clear_error_offline(tmp_path, audio_json, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError, match="cannot load ASR model 'no-such-model'"):
        AsrStage().run(_request(tmp_path, audio_json, model="no-such-model"))


def wav_16k(path, samples) -> str:
    """``samples`` (16 kHz, floats in [-1, 1]) written as a 16-bit PCM WAV at ``path``; the path as text."""
    import wave

    import numpy as np

    with wave.open(str(path), "wb") as f:
        f.setnchannels(1), f.setsampwidth(2), f.setframerate(16000)
        f.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return str(path)


def test_no_fragment_after_a_chunk_boundary_and_no_words_from_silence_or_noise(tmp_path, media):
    """The host's first turn cut to 4.0 s plus 3 s of silence, decoded with 4 s chunks: whisperX's VAD cuts it
    at 4.03 s and leaves an 85 ms tail that Whisper decodes as "you" unless the tail joins its piece.
    Pure silence and pure noise give no segments and say why. One model load for the three inputs."""
    import numpy as np

    sr = 16000
    AUDIO.run(
        StageRequest(
            request_id="a",
            stage="audio",
            module="stages.audio",
            batch_size=1,
            result_path=str(tmp_path / "r.json"),
            settings=stage_settings("audio"),
            items=[
                WorkItem(
                    id="d",
                    inputs={"source": str(media / "speakers" / "host_guest.mp4")},
                    output=str(tmp_path / "dialogue.json"),
                    fingerprint="fp",
                )
            ],
        )
    )
    dialogue = np.load(next(tmp_path.glob("*.npy")))
    sources = {
        "tail": wav_16k(tmp_path / "tail.wav", np.concatenate([dialogue[: 4 * sr], np.zeros(3 * sr)])),
        "silence": wav_16k(tmp_path / "silence.wav", np.zeros(8 * sr)),
        "noise": wav_16k(tmp_path / "noise.wav", 0.05 * np.random.default_rng(0).standard_normal(8 * sr)),
    }
    AUDIO.run(
        StageRequest(
            request_id="b",
            stage="audio",
            module="stages.audio",
            batch_size=1,
            result_path=str(tmp_path / "r2.json"),
            settings=stage_settings("audio"),
            items=[
                WorkItem(
                    id=k, inputs={"source": v}, output=str(tmp_path / f"{k}-audio.json"), fingerprint="fp"
                )
                for k, v in sources.items()
            ],
        )
    )
    request = _request(tmp_path, tmp_path / "tail-audio.json", chunk_size=4)
    request = request.model_copy(
        update={
            "items": [
                WorkItem(
                    id=k,
                    inputs={"audio": str(tmp_path / f"{k}-audio.json")},
                    output=str(tmp_path / f"{k}-asr.json"),
                    fingerprint="fp",
                )
                for k in sources
            ]
        }
    )
    result = AsrStage().run(request)
    assert all(r.ok for r in result.items), result.items
    tail = load_artifact(tmp_path / "tail-asr.json", TranscriptArtifact)
    assert [len(s.text.split()) > 1 for s in tail.segments] == [True], tail.segments
    assert (
        wer("Thanks for joining us. What got you interested in mapping old roads?", tail.segments[0].text)
        < 0.2
    )
    assert len(tail.speech) == 1 and tail.speech[0][1] > 4.05, "the tail was joined to its piece, not dropped"
    for quiet in ("silence", "noise"):
        transcript = load_artifact(tmp_path / f"{quiet}-asr.json", TranscriptArtifact)
        assert transcript.segments == [] and transcript.speech == [], (quiet, transcript.segments)
        assert transcript.speech_note.startswith("no speech detected"), transcript.speech_note


# -- cross-input packing ----------------------------------------------------------------------------


def decode_audio(tmp: Path, sources: dict[str, Path]) -> dict[str, Path]:
    """The audio stage over ``sources`` (name -> media file) in this process: name -> its ``audio.json``."""
    items = [
        WorkItem(
            id=name, inputs={"source": str(path)}, output=str(tmp / f"{name}.audio.json"), fingerprint="fp"
        )
        for name, path in sources.items()
    ]
    AUDIO.import_libraries()
    result = AUDIO.run(
        StageRequest(
            request_id="a",
            stage="audio",
            module="stages.audio",
            batch_size=1,
            result_path=str(tmp / "r.json"),
            settings=stage_settings("audio"),
            items=items,
        )
    )
    assert all(r.ok for r in result.items), result.items
    return {name: tmp / f"{name}.audio.json" for name in sources}


@pytest.fixture(scope="module")
def several_audio(tmp_path_factory, media):
    """Decoded audio of four inputs of different lengths (the speech clip twice, two dialogues)."""
    return decode_audio(
        tmp_path_factory.mktemp("several"),
        {
            "speech": media / "speech.wav",
            "dialogue": media / "speakers" / "host_guest.mp4",
            "speech2": media / "speech.mp4",
            "stranger": media / "speakers" / "host_stranger.mp4",
        },
    )


def run_asr_stage(
    tmp,
    audio: dict,
    batch_size: int,
    settings: dict,
    extra: list[WorkItem] = (),
    attempt: int = 1,
    vocabulary: dict | None = None,
    spy: Callable[[AsrStage], None] | None = None,
    isolate: list[str] = (),
):
    """The ASR stage in this process over ``audio`` (+ ``extra`` items after the first two; each input with
    its ``vocabulary`` files, by name; ``spy`` sees the stage before it runs); its result, the transcripts of
    the items that succeeded, and the item ids in flight at each step."""
    items = [
        WorkItem(
            id=name,
            inputs={"audio": str(path)},
            output=str(tmp / f"{name}.json"),
            fingerprint="fp",
            vocabulary=(vocabulary or {}).get(name, []),
        )
        for name, path in audio.items()
    ]
    request = StageRequest(
        request_id="r",
        stage="asr",
        module="stages.asr",
        batch_size=batch_size,
        device="cpu",
        settings=stage_settings("asr", **settings),
        result_path=str(tmp / "res.json"),
        inflight_path=str(tmp / "inflight.json"),
        items=[*items[:2], *extra, *items[2:]],
        attempt=attempt,
        isolate=list(isolate),
    )
    seen: list[list[str]] = []
    stage = AsrStage()
    write = stage._write_in_flight
    stage._write_in_flight = lambda req, in_flight: (seen.append(in_flight.ids), write(req, in_flight))
    if spy is not None:
        spy(stage)
    result = stage.run(request)
    transcripts = {r.id: load_artifact(r.output, TranscriptArtifact) for r in result.items if r.ok}
    return result, transcripts, seen


def _run_several(tmp, audio: dict, batch_size: int, pack: bool, extra: list[WorkItem] = ()):
    return run_asr_stage(
        tmp, audio, batch_size, dict(pack_inputs=pack, chunk_size=6, join_inputs=False), extra
    )


def test_packed_batches_give_the_same_transcripts_as_one_input_at_a_time(tmp_path, several_audio):
    (tmp_path / "alone").mkdir()
    (tmp_path / "packed").mkdir()
    _, alone, alone_seen = _run_several(tmp_path / "alone", several_audio, 4, pack=False)
    result, packed, packed_seen = _run_several(tmp_path / "packed", several_audio, 4, pack=True)
    assert [r.id for r in result.items] == [
        "speech",
        "dialogue",
        "speech2",
        "stranger",
    ]  # written as they finish
    for name in several_audio:
        assert [(s.start, s.end) for s in packed[name].segments] == [
            (s.start, s.end) for s in alone[name].segments
        ]
        assert (
            wer(
                " ".join(s.text for s in alone[name].segments),
                " ".join(s.text for s in packed[name].segments),
            )
            <= 0.02
        ), name
    assert wer(SPEECH_TEXT, " ".join(s.text for s in packed["speech"].segments)) < MAX_WER
    # each input's seconds are its own share of the shared batches, not the batch's time nor its wait for
    # the batch to fill: together they are the child's compute (the first input also bears the libraries'
    # first-call warm-up, so the shares need not follow the clips' lengths)
    own = {r.id: r.seconds for r in result.items}
    assert sum(own.values()) <= result.compute_s * 1.02, (own, result.compute_s)
    assert sum(own.values()) >= result.compute_s * 0.6, (own, result.compute_s)
    # packing: some decoder batch held windows of two inputs; alone: never
    assert any(len(ids) > 1 for ids in packed_seen), packed_seen
    assert all(len(ids) == 1 for ids in alone_seen), alone_seen


def test_word_timing_failing_for_one_input_spares_the_others_in_its_batch(
    tmp_path, several_audio, monkeypatch
):
    """Windows of several inputs share a decoder batch: word timing failing for the windows of one input
    leaves those without words (the alignment stage times them) and every other window of the batch timed."""
    import stages.whisper.align

    timed = stages.whisper.align.timed_words
    markers = {"fox", "shells", "stella", "store"}  # words of the speech clip, not of the dialogues

    def fails_on_the_speech_clip(tokenizer, tokens, *args):
        if markers & set(tokenizer.decode(tokens).lower().replace(".", " ").replace(",", " ").split()):
            raise ValueError("no alignment for this window")
        return timed(tokenizer, tokens, *args)

    monkeypatch.setattr(stages.whisper.align, "timed_words", fails_on_the_speech_clip)
    result, transcripts, seen = _run_several(tmp_path, several_audio, 4, pack=True)
    assert all(r.ok for r in result.items), result.items
    assert any({"speech", "dialogue"} <= set(ids) for ids in seen), seen  # a batch held both
    for name in ("dialogue", "stranger"):
        assert transcripts[name].segments and all(s.words for s in transcripts[name].segments), name
    for name in ("speech", "speech2"):
        segments = transcripts[name].segments
        assert any(s.words is None for s in segments), name
        assert wer(SPEECH_TEXT, " ".join(s.text for s in segments)) < MAX_WER, name


def test_one_input_whisperx_would_transcribe_the_same(several_audio):
    import numpy as np

    stage = AsrStage()
    stage.settings = stage.settings_model.model_validate(stage_settings("asr", chunk_size=6))
    stage.import_libraries()
    stage.batch_size, stage.device = 4, "cpu"
    stage.load(None, "cpu")
    audio = load_artifact(several_audio["dialogue"], AudioArtifact)
    samples = np.load(several_audio["dialogue"].parent / audio.sidecar)
    theirs = stage.model.transcribe(samples, batch_size=4, language="en", chunk_size=6)["segments"]
    ours = stage._speech_windows(samples)
    assert [(round(a, 3), round(b, 3)) for a, b in ours] == [(s["start"], s["end"]) for s in theirs]


def test_an_unreadable_input_in_the_middle_fails_alone(tmp_path, several_audio):
    broken = tmp_path / "broken.audio.json"
    broken.write_text("{not json")
    bad = WorkItem(
        id="broken", inputs={"audio": str(broken)}, output=str(tmp_path / "broken.json"), fingerprint="fp"
    )
    result, transcripts, _ = _run_several(tmp_path, several_audio, 8, pack=True, extra=[bad])
    by_id = {r.id: r for r in result.items}
    assert not by_id["broken"].ok and "upstream artifact unusable" in by_id["broken"].error
    assert set(transcripts) == set(several_audio)


# -- cross-input joining ----------------------------------------------------------------------------

#: what make_media.sh has espeak-ng say in each enrollment clip (one sentence each, in no dialogue)
ENROLL_TEXT = {
    "host_enroll_1": "Welcome back. Today we talk about rivers and bridges.",
    "host_enroll_2": "I grew up near the harbour, close to the boats.",
    "guest_enroll_1": "My grandmother kept old maps in the attic.",
}


def decode_sources(tmp, sources: dict) -> dict:
    """The audio stage over ``sources`` (name -> media file): name -> its audio.json."""
    AUDIO.import_libraries()
    items = [
        WorkItem(id=k, inputs={"source": str(v)}, output=str(tmp / f"{k}.audio.json"), fingerprint="fp")
        for k, v in sources.items()
    ]
    result = AUDIO.run(
        StageRequest(
            request_id="a",
            stage="audio",
            module="stages.audio",
            batch_size=1,
            result_path=str(tmp / "r.json"),
            settings=stage_settings("audio"),
            items=items,
        )
    )
    assert all(r.ok for r in result.items), result.items
    return {k: tmp / f"{k}.audio.json" for k in sources}


@pytest.fixture(scope="module")
def distinct_clips(tmp_path_factory, media):
    """Eleven short inputs (2-6 s), each with its own sentences: the eight turns of the two dialogues cut at their
    RTTM times (two voices) and the three enrollment clips. Returns (audio.json by name, reference text by name)."""
    import re

    import numpy as np

    tmp = tmp_path_factory.mktemp("distinct")
    AUDIO.import_libraries()

    def decode(sources: dict) -> dict:
        return decode_sources(tmp, sources)

    sources, texts = {}, {}
    for dialogue, text in DIALOGUE_TEXT.items():
        audio = decode({dialogue: media / "speakers" / f"{dialogue}.mp4"})[dialogue]
        samples = np.load(audio.parent / load_artifact(audio, AudioArtifact).sidecar)
        turns = [line.split() for line in (media / "speakers" / f"{dialogue}.rttm").read_text().splitlines()]
        sentences = re.findall(r"[^.?!]+[.?!]", text)
        # the turns are the sentences in order; the first turn of host_guest holds two, as does a stranger's
        per_turn = {"host_guest": [2, 1, 1, 1], "host_stranger": [1, 2, 2, 2]}[dialogue]
        for n, (turn, _count) in enumerate(zip(turns, per_turn)):
            start, length = float(turn[3]), float(turn[4])
            piece = samples[max(0, int((start - 0.2) * 16000)) : int((start + length + 0.2) * 16000)]
            name = f"{dialogue}_{n}"
            sources[name] = wav_16k(tmp / f"{name}.wav", piece)
            texts[name] = " ".join(s.strip() for s in sentences[sum(per_turn[:n]) : sum(per_turn[: n + 1])])
    for name, text in ENROLL_TEXT.items():
        sources[name], texts[name] = media / "speakers" / f"{name}.wav", text
    assert normalise(" ".join(texts[f"host_guest_{n}"] for n in range(4))) == normalise(
        DIALOGUE_TEXT["host_guest"]
    )
    return decode(sources), texts


#: speech.wav's three sentences: where the silences between them are (seconds)
SPEECH_SENTENCES = [(0.0, 3.25), (3.25, 5.96), (5.96, None)]


@pytest.fixture(scope="module")
def sentence_clips(tmp_path_factory, media, distinct_clips):
    """Eight sentences of 2.5-5 s with known text, each its own input, in two kinds of voice: speech.wav cut at
    the silences between its three sentences, languages/en.ogg, and four one-sentence clips of the dialogue
    fixtures. Returns (audio.json by name, reference text by name)."""
    import re

    import numpy as np

    tmp = tmp_path_factory.mktemp("sentences")
    whole = decode_sources(tmp, {"speech": media / "speech.wav"})["speech"]
    samples = np.load(whole.parent / load_artifact(whole, AudioArtifact).sidecar)
    sentences = re.findall(r"[^.?!]+[.?!]", SPEECH_TEXT)
    sources, texts = {}, {}
    for n, ((start, end), text) in enumerate(zip(SPEECH_SENTENCES, sentences)):
        piece = samples[int(start * 16000) : int(end * 16000) if end else None]
        sources[f"speech_{n}"], texts[f"speech_{n}"] = wav_16k(tmp / f"speech_{n}.wav", piece), text.strip()
    sources["en"] = media / "languages" / "en.ogg"
    texts["en"] = (media / "languages" / "en.txt").read_text().strip()
    audio = decode_sources(tmp, sources)
    clips, truth = distinct_clips
    for name in ["host_guest_2", "host_stranger_0", "host_enroll_1", "guest_enroll_1"]:
        audio[name], texts[name] = clips[name], truth[name]
    return audio, texts


def _run_clips(tmp, audio: dict, attempt: int = 1, isolate: list[str] = (), **settings):
    (tmp).mkdir()
    return run_asr_stage(tmp, audio, 4, settings, attempt=attempt, isolate=isolate)


def run_alone_and_joined(tmp, distinct_clips, **settings):
    """The eleven clips decoded each alone, then in joined windows (the stage's ``settings`` besides)."""
    audio, _ = distinct_clips
    return _run_clips(tmp / "alone", audio, join_inputs=False, **settings), _run_clips(
        tmp / "joined", audio, join_inputs=True, **settings
    )


@pytest.fixture(scope="module")
def alone_and_joined(tmp_path_factory, distinct_clips):
    return run_alone_and_joined(tmp_path_factory.mktemp("joining"), distinct_clips)


def test_joined_windows_give_every_word_to_its_own_input_in_its_own_time(distinct_clips, alone_and_joined):
    """Eleven inputs with distinct sentences share Whisper windows: every word of each transcript belongs to that
    input's own sentences (none is only in another input's), the segments are the input's own windows as when it
    is decoded alone, the words are timed inside the input's own audio, where decoding it alone puts them, and the
    word error rate is that of one input at a time."""
    check_joined_windows(distinct_clips, alone_and_joined)


def check_joined_windows(distinct_clips, alone_and_joined) -> None:
    """The assertions of the test above, for the clips decoded alone and joined on either runtime."""
    import jiwer

    audio, texts = distinct_clips
    (alone_result, alone, alone_seen), (result, joined, seen) = alone_and_joined
    assert all(r.ok for r in result.items) and all(r.ok for r in alone_result.items)
    assert any(len(ids) >= 3 for ids in seen), seen  # windows held several inputs ...
    assert all(len(ids) == 1 for ids in alone_seen), alone_seen  # ... which they never do without joining
    vocab = {name: set(normalise(text).split()) for name, text in texts.items()}
    for name in audio:
        # the other inputs' words of four letters or more (a misheard "a" may come out as "the" anywhere) that
        # are neither in this input's sentences nor in what it is heard as alone
        heard_alone = set(normalise(" ".join(s.text for s in alone[name].segments)).split())
        others = (
            {w for k, v in vocab.items() if k != name for w in v if len(w) >= 4} - vocab[name] - heard_alone
        )
        transcript = joined[name]
        words = [w for s in transcript.segments for w in s.words]
        foreign = [w.word for w in words if set(normalise(w.word).split()) & others]
        assert not foreign, (name, foreign, [s.text for s in transcript.segments])
        assert [(s.start, s.end) for s in transcript.segments] == [
            (s.start, s.end) for s in alone[name].segments
        ]
        for seg in transcript.segments:
            # the words are the text (an input decoded again alone keeps the decoder's text, whose spacing the
            # word split may not keep: "b**ch" as "b" "**ch" on torch)
            assert "".join(w.word for w in seg.words).replace(" ", "") == seg.text.replace(" ", ""), seg.text
            assert all(
                seg.start <= w.start <= w.end <= seg.end <= transcript.duration_s + 0.5 for w in seg.words
            ), (
                name,
                seg.start,
                seg.end,
                transcript.duration_s,
                [(w.word, w.start, w.end) for w in seg.words],
            )
        theirs = [w for s in alone[name].segments for w in s.words]
        if [w.word for w in words] == [
            w.word for w in theirs
        ]:  # the same words: the same times, give or take
            gaps = sorted(abs(a.start - b.start) for a, b in zip(words, theirs))
            assert gaps[len(gaps) // 2] <= 0.1 and gaps[-1] <= 0.6, (name, gaps)
    refs = [normalise(texts[name]) for name in audio]

    def total_wer(transcripts):
        return jiwer.wer(refs, [normalise(" ".join(s.text for s in transcripts[n].segments)) for n in audio])

    assert total_wer(joined) <= total_wer(alone) + 0.03, (total_wer(joined), total_wer(alone))
    assert total_wer(joined) < MAX_WER


def foreign_words(transcripts: dict, texts: dict, names: dict) -> dict:
    """For each input (``names``: input -> its clip's name in ``texts``), the words of its transcript of five
    letters or more that another clip's sentences hold and its own do not (checked against what was said)."""
    vocab = {clip: set(normalise(text).split()) for clip, text in texts.items()}
    out = {}
    for name, transcript in transcripts.items():
        own = vocab[names[name]]
        # (words of five letters or more: a misheard "has" may come out as "from" anywhere)
        others = {w for clip, v in vocab.items() if clip != names[name] for w in v if len(w) >= 5} - own
        heard = normalise(" ".join(s.text for s in transcript.segments)).split()
        if foreign := [w for w in heard if w in others]:
            out[name] = (foreign, heard)
    return out


def test_many_short_clips_of_different_sentences_in_joined_windows_keep_their_own_words(
    tmp_path, sentence_clips
):
    """Given 32 short inputs, eight clips of different sentences four times over in turn (two kinds of voice,
    2.5-5 s, so that each joined window holds several sentences), when they are decoded in joined windows, then
    no transcript holds a word of another clip's sentence that its own does not (by the truth, not a decode),
    and none is empty."""
    audio, texts = sentence_clips
    names = {f"{clip}-{n}": clip for n in range(4) for clip in audio}
    many = {name: audio[clip] for name, clip in names.items()}
    result, joined, seen = _run_clips(tmp_path / "many", many, join_inputs=True)
    assert all(r.ok for r in result.items)
    assert any(len(ids) >= 3 for ids in seen), seen  # windows were shared
    assert not foreign_words(joined, texts, names)
    assert all(t.segments for t in joined.values()), [n for n, t in joined.items() if not t.segments]


def test_a_join_group_with_only_some_inputs_asked_for_is_decoded_whole_and_only_those_are_written(
    tmp_path, distinct_clips
):
    """Given a join group of five clips decoded whole, when a request asks for two of them only (a resumed run)
    and names the group's members, then the other three are decoded beside them all the same (never written)
    and the two get byte for byte the text and words they got the first time."""
    import json

    audio, _ = distinct_clips
    names = ["host_guest_0", "host_enroll_1", "guest_enroll_1", "host_guest_2", "host_enroll_2"]
    members = json.dumps([[n, str(audio[n])] for n in names])

    def run(tmp, asked):
        tmp.mkdir()
        request = StageRequest(
            request_id="r",
            stage="asr",
            module="stages.asr",
            batch_size=4,
            device="cpu",
            settings=stage_settings("asr", join_inputs=True),
            result_path=str(tmp / "res.json"),
            items=[
                WorkItem(
                    id=n,
                    inputs={"audio": str(audio[n]), "join_group": "g1", "join_members": members},
                    output=str(tmp / f"{n}.json"),
                    fingerprint="fp",
                )
                for n in asked
            ],
        )
        result = AsrStage().run(request)
        assert all(r.ok for r in result.items) and [r.id for r in result.items] == asked
        assert sorted(p.name for p in tmp.glob("*.json") if p.name != "res.json") == sorted(
            f"{n}.json" for n in asked
        )
        return {n: load_artifact(tmp / f"{n}.json", TranscriptArtifact).segments for n in asked}

    whole = run(tmp_path / "whole", names)
    some = run(tmp_path / "some", ["host_enroll_1", "host_guest_2"])
    assert some == {n: whole[n] for n in some}


def test_a_joined_window_that_fails_is_decoded_input_by_input_and_only_the_culprit_fails(
    tmp_path, distinct_clips, alone_and_joined, monkeypatch
):
    """A decoder batch that holds a poisonous input's speech fails (here: any batch with host_stranger_1 in it);
    the inputs of its joined windows are decoded again one by one, so host_stranger_1 fails alone and every
    other input gets the windows it gets alone."""
    audio, _ = distinct_clips
    (_, alone, _), _ = alone_and_joined
    generate = AsrStage._generate

    def poisoned(self, batch, temperature=0.0):
        if any(job.item.id == "host_stranger_1" for window in batch for job, _ in window.parts):
            raise RuntimeError("a window this decoder cannot take")
        return generate(self, batch, temperature)

    monkeypatch.setattr(AsrStage, "_generate", poisoned)
    some = {
        name: audio[name]
        for name in [
            "host_stranger_0",
            "host_stranger_1",
            "host_stranger_2",
            "host_enroll_1",
            "guest_enroll_1",
        ]
    }
    result, transcripts, seen = _run_clips(tmp_path / "poison", some, join_inputs=True)
    by_id = {r.id: r for r in result.items}
    assert not by_id["host_stranger_1"].ok and "cannot take" in by_id["host_stranger_1"].error
    assert any("host_stranger_1" in ids and len(ids) > 1 for ids in seen), seen  # it shared a window first
    assert set(transcripts) == set(some) - {"host_stranger_1"}
    for name, transcript in transcripts.items():
        assert [s.text for s in transcript.segments] and [(s.start, s.end) for s in transcript.segments] == [
            (s.start, s.end) for s in alone[name].segments
        ], name


def test_a_respawned_child_joins_as_planned_and_decodes_only_the_isolated_input_alone(
    tmp_path, distinct_clips, alone_and_joined
):
    """A respawned child (a random kill) joins windows as planned, so no word changes; an input the parent
    isolates (in flight at repeated deaths with others) is decoded alone, the only input in flight, and gets
    the words it has alone."""
    audio, _ = distinct_clips
    (_, alone, _), (_, joined, _) = alone_and_joined
    result, transcripts, seen = _run_clips(tmp_path / "respawned", audio, attempt=2, join_inputs=True)
    assert all(r.ok for r in result.items) and set(transcripts) == set(audio)
    assert any(len(ids) > 1 for ids in seen), seen
    for name, transcript in transcripts.items():
        assert [s.text for s in transcript.segments] == [s.text for s in joined[name].segments], name
    suspect = list(audio)[1]
    result, transcripts, seen = _run_clips(
        tmp_path / "isolated", audio, attempt=3, isolate=[suspect], join_inputs=True
    )
    assert all(r.ok for r in result.items) and set(transcripts) == set(audio)
    assert [suspect] in seen and not any(suspect in ids and len(ids) > 1 for ids in seen), seen
    assert any(len(ids) > 1 for ids in seen), seen  # the others still share windows
    assert [s.text for s in transcripts[suspect].segments] == [s.text for s in alone[suspect].segments]


# -- Whisper's repetition guard ----------------------------------------------------------------------------------


def test_a_window_that_repeats_itself_is_decoded_again_at_rising_temperatures_reproducibly(
    tmp_path, audio_json, caplog
):
    """With a guard no text can pass (compression ratio above 1.01), every window is decoded again by sampling at
    0.2, 0.4 ... 1.0 and keeps the least looped, else likeliest, decode (stages.whisper.speech.better_loop): the
    transcript stays as good as the greedy one, its words are timed for the text kept, and a second run gives the
    same text (the sampling is seeded)."""
    check_repetition_guard(tmp_path, audio_json, caplog)


def check_repetition_guard(tmp_path, audio_json, caplog, **settings) -> TranscriptArtifact:
    """The assertions of the test above, with the stage's ``settings`` besides (e.g. its runtime); returns the
    transcript decoded with the guard on."""

    def run(name, threshold):
        (tmp_path / name).mkdir()
        request = _request(tmp_path / name, audio_json, compression_ratio_threshold=threshold, **settings)
        result = AsrStage().run(request)
        assert result.items[0].ok, result.items[0].error
        return load_artifact(tmp_path / name / "transcript.json", TranscriptArtifact)

    greedy = run("greedy", None).segments
    with caplog.at_level("WARNING", logger="stages.asr"):
        guarded = run("first", 1.01)
    first, again = guarded.segments, run("again", 1.01).segments
    said = caplog.text
    for temperature in ("0.2", "0.4", "0.6", "0.8", "1.0"):
        assert f"decoding it again at {temperature}" in said, said
    assert "at temperature 1.0; kept" in said
    assert [(s.start, s.end) for s in first] == [(s.start, s.end) for s in greedy]
    assert (
        wer(SPEECH_TEXT, " ".join(s.text for s in first))
        <= wer(SPEECH_TEXT, " ".join(s.text for s in greedy)) + 0.05
    )
    for mine in first:
        assert mine.words and " ".join(w.word for w in mine.words) == mine.text
    assert [s.text for s in again] == [s.text for s in first]
    return guarded
