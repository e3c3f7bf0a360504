"""The synthetic text-line renderer behind scripts/make_synthetic.py.

fonts.py finds the typefaces (fontconfig, font packages from PyPI, a folder) and splits their
families into those `train` and `val` use and those held out for `test`; text.py draws what is
written (words, numbers, random strings, in the cases the alphabet allows); backgrounds.py paints
what it is written on; render.py composes a sample: text, background, geometry and degradations.
"""
