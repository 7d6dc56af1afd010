"""The committed stubs in protocol/_generated must be what `make proto` produces now."""

from pathlib import Path

from protocol import codegen


def test_generated_stubs_match_proto(tmp_path: Path) -> None:
    fresh = codegen.generate(tmp_path)
    for name, text in fresh.items():
        committed = (codegen.GENERATED / name).read_text()
        assert committed == text, f"protocol/_generated/{name} is stale: run `make proto` and commit the result"
