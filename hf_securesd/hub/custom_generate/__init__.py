"""Holds `generate.py`, the file transformers runs for `custom_generate=`; not imported by hf_securesd."""
