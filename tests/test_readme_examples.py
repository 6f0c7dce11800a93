"""README.md's embed example, run as printed (only the URL swapped): it
leads and exits 0, and a start-up error comes out as itself, not a group."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"
README_URL = "postgresql://localhost/awa"


def embed_example() -> str:
    match = re.search(r"## Embed in a Trio application\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert match, "README.md has no embed example"
    assert README_URL in match.group(1)
    return match.group(1)


def run_example(tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "embed_example.py"
    script.write_text(embed_example().replace(README_URL, url))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)


async def test_the_embed_example_leads_and_stops(database_url, tmp_path):
    import trio

    done = await trio.to_thread.run_sync(run_example, tmp_path, database_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "leading: True alive: True"


async def test_the_embed_example_raises_a_start_up_error_as_itself(database_url, tmp_path):
    import trio

    missing = database_url.rsplit("/", 1)[0] + "/awa_trio_no_such_database"
    done = await trio.to_thread.run_sync(run_example, tmp_path, missing)
    assert done.returncode == 1
    assert "ExceptionGroup" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        'awa_trio.db.QueryError: database "awa_trio_no_such_database" does not exist')
