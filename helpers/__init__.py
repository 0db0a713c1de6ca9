"""The course's library: "GPU memory and LLM quantization, from OOM to production".

A regular package (not a namespace package), so no other ``helpers`` folder on ``sys.path`` merges
into it. Importing it does nothing: each notebook imports the modules it uses (``from helpers import
budget``); the layers and what each module is for are listed in the README ("Layout").
"""
