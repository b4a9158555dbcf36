"""What a run will do, decided before any child starts. ``inputs`` walks the arguments, gives each source
its id (kept in ``OUT/.ids.json``) and makes the immutable :class:`~orchestrator.planning.inputs.Input`;
``vocabulary`` finds the vocabulary files that apply to it; ``state`` is what a run learns and does about a
planned input; ``fingerprints`` chains each stage's expected fingerprint from the source's identity and
tells whether an artifact on disk is current; ``needs`` decides which stages each input needs (or none: the
fast resume), what a stage's child gets, and the dry run's plan; ``groups`` fixes which inputs may share a
Whisper window. Planning reads artifacts and the output folder's books, and starts no child."""
