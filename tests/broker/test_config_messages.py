"""A server.ini mistake is reported with the file, the line and the nearest known key."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from notify.cli import main
from notify.config import load_config, parse_config
from notify.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[system]\nbrokerId=1\nnumPartition=3\n",
         ":3: [system] numPartition: unknown key 'numPartition'; did you mean 'numPartitions'?"),
        ("[system]\n\n[topic=a]\nnumpartitions=2\n",
         ":4: [topic=a] numpartitions: unknown key 'numpartitions'; did you mean 'numPartitions'?"),
        ("; comment\n[sytem]\n", ":2: [sytem]: unknown section; did you mean [system]?"),
        ("[system]\nauthSecret=a\nadminSecret=a\n", ":3: [system] adminSecret: must differ"),
        ("[system]\nmaxDelay=0\n", ":2: [system] maxDelay: 0 is out of range"),
        ("[system]\n[topic=a]\ndeleteWhen=nope\n", ":3: [topic=a] deleteWhen 'nope'"),
    ],
)
def test_errors_name_file_line_and_nearest_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "server.ini"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(str(path.resolve()) + expected), str(e.value)


def test_unknown_key_far_from_every_known_one_lists_nothing() -> None:
    with pytest.raises(ConfigError) as e:
        parse_config("[system]\nxyzzy=1\n")
    msg = str(e.value)
    assert msg.startswith("<config>:2: [system] xyzzy: unknown key") and "did you mean" not in msg
    assert len(msg) < 200  # not the ~90 known keys


def test_config_check_prints_the_located_error(tmp_path: Path) -> None:
    path = tmp_path / "server.ini"
    path.write_text("[system]\nserverPort=8123\nunflushTreshold=0\n")
    r = CliRunner().invoke(main, ["config", "check", "-c", str(path)])
    assert r.exit_code == 2
    assert f"{path.resolve()}:3:" in r.output and "did you mean 'unflushThreshold'?" in r.output
