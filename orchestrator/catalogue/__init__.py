"""The corpus catalogue: an output folder's segments, inputs and speakers in one embedded database, for
search by words, meaning and speaker. Derived from the per-input files, never their source
(docs/search.md)."""
