"""bench/status.py, the generator of the docs' status tables (ctest docs_status runs its --check on
the real docs): on a scratch tree it finds a stale block, names the command that updates it,
rewrites it, and lists what the registry and the records hold, read here independently."""
import glob
import json
import os
import subprocess
import sys

import ditops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATUS = os.path.join(ROOT, "bench", "status.py")
RECORDS = os.path.join(ROOT, "bench", "results", "h200")


def run(*args):
    return subprocess.run([sys.executable, STATUS, *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))


def scratch(tmp_path, body):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text(body)
    return page


def block(name, text):
    return f"before\n<!-- status:{name}:begin (generated) -->\n{text}<!-- status:{name}:end -->\nafter\n"


def test_a_stale_block_fails_the_check_and_write_fixes_it(tmp_path):
    page = scratch(tmp_path, block("models", "| a stale table |\n"))
    check = run("--check", "--only", "models", "--root", str(tmp_path))
    assert check.returncode == 1, check.stdout + check.stderr
    assert "bench/status.py --write" in check.stdout and "'models'" in check.stdout
    assert "-| a stale table |" in check.stdout  # the diff shows the committed line

    assert run("--write", "--only", "models", "--root", str(tmp_path)).returncode == 0
    text = page.read_text()
    assert text.startswith("before\n<!-- status:models:begin (generated) -->\n") and text.endswith(
        "<!-- status:models:end -->\nafter\n")
    assert "a stale table" not in text
    again = run("--check", "--only", "models", "--root", str(tmp_path))
    assert again.returncode == 0, again.stdout + again.stderr


def test_models_block_holds_every_model_record(tmp_path):
    page = scratch(tmp_path, block("models", ""))
    assert run("--write", "--only", "models", "--root", str(tmp_path)).returncode == 0
    rows = {line.split(" | ")[0]: line for line in page.read_text().splitlines() if line.startswith("| ")}
    files = sorted(glob.glob(os.path.join(RECORDS, "models", "*.json")))
    assert files
    for path in files:
        records = json.load(open(path))["records"]
        row = next(v for k, v in rows.items() if f"(`{os.path.basename(path)}`)" in k)
        first = records[0]  # eager where the step timed it; a split step's file may start elsewhere
        assert f" {first['us'] / 1000:.2f} " in row, row
        assert first["commit"] in row


def test_ops_block_lists_every_registered_implementation(tmp_path):
    page = scratch(tmp_path, block("ops", ""))
    result = run("--write", "--only", "ops", "--root", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    text = page.read_text()
    kernels = ditops.list_kernels()
    assert kernels
    for k in kernels:
        row = next(line for line in text.splitlines() if f"| `{k['name']}` |" in line)
        assert f"| {k['contract']} |" in row
        assert k["verification"].split(":")[0] in row  # verified / unverified, as the registry says


def test_unknown_and_missing_blocks_fail(tmp_path):
    scratch(tmp_path, block("no-such-block", "x\n"))
    result = run("--check", "--only", "models", "--root", str(tmp_path))
    assert result.returncode == 1
    assert "unknown block 'no-such-block'" in result.stdout
    assert "no file of README.md and docs/ has the block 'models'" in result.stdout
