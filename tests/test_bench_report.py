"""The benchmark scripts share one markdown file: each rewrites its own section and keeps the others."""

from experiments import bench_process


def test_a_report_replaces_its_own_section_and_keeps_the_others(tmp_path, capsys):
    out = tmp_path / "benchmarks.md"
    bench_process.report(["# Anakin throughput", "", "anakin v1"], str(out))
    bench_process.report(["# Sebulba throughput", "", "sebulba v1"], str(out))
    bench_process.report(["# MuZero throughput", "", "muzero v1"], str(out))
    bench_process.report(["# Sebulba throughput", "", "sebulba v2", "## a subsection"], str(out))
    bench_process.report(["# Anakin throughput", "", "anakin v2"], str(out))

    assert out.read_text() == (
        "# Anakin throughput\n\nanakin v2\n\n"
        "# Sebulba throughput\n\nsebulba v2\n## a subsection\n\n"
        "# MuZero throughput\n\nmuzero v1\n"
    )
    assert "anakin v2" in capsys.readouterr().out


def test_an_empty_out_only_prints(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a file written anywhere relative would land here
    bench_process.report(["# Anakin throughput", "row"], "")
    assert "row" in capsys.readouterr().out
    assert list(tmp_path.rglob("*")) == []
