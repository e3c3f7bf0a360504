"""Everything between an LMDB and a batch: the alphabet and codec, the LMDB format (lmdb_keys.py,
lmdb_dataset.py, lmdb_writer.py), the image transform and augmentation, the samplers and the two
loaders."""
