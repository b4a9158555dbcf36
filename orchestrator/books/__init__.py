"""The output folder's books: what a folder keeps about itself across runs, read by planning, the run, the
products and the API alike. ``journal`` is the append-only history of what each input completed, stage by
stage (``OUT/journal.jsonl``); ``lock`` holds one run per output folder (``OUT/.lock``); ``speakers`` keeps
the corpus speakers (who is who across the folder, their names and merges) in tables written a chunk at a
time. None plans, runs nor writes a product: they only keep the record."""
