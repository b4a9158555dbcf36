"""What each stage will run, and the model cache: resolved in the parent without loading a model. ``choice``
names the model each stage runs (a hub revision, an embedded package's version, a local folder's files, or
the fallback it will take), which goes into the stage's fingerprint; ``hub`` decides once per run whether
the children may reach the Hugging Face hub and sees what the run downloaded; ``cache`` lists what the
settings need, pulls it into the cache on a connected machine and verifies the cached files
(``pipeline models``). Only the hub client is used here, never a model library."""
