"""Everything between an LMDB and a batch: the alphabet and codec (alphabet.py, codec.py), the LMDB format
(lmdb_keys.py), opening, reading and writing LMDBs (lmdb_env.py, lmdb_dataset.py, lmdb_writer.py), which
samples are usable (label_index.py), the image formats read and the one opener of an image
(image_formats.py), the image transform and augmentation (transforms.py, augment.py, opencv_resize.py),
the samplers and the two loaders (samplers.py, loaders.py), the image files a command line names
(image_files.py), the leakage check between training and evaluation LMDBs (overlap.py), and where a
dataset came from, its meta.json and a run's record of them (provenance.py)."""
