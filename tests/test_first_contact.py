"""A newcomer's mistakes, class by class: each gets one line naming the file, field or row and what is allowed,
exit status 2, no traceback; odd but valid inputs are accepted and read the same way everywhere."""
import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from sim.cli import main
from sim.scenario.config import load_scenario

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--set", "workload.num_requests=8"]
HEADER = "arrival_s,prompt_tokens,output_tokens\n"


def one_line_error(capsys, argv, *fragments):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("servesim: error:"), err
    for f in fragments:
        assert f in err[0], err[0]
    return err[0]


def _trace_scenario(tmp_path, name, content: bytes | None = None, directory=False):
    path = tmp_path / name
    if directory:
        path.mkdir()
    else:
        path.write_bytes(content)
    scn = tmp_path / f"s-{name}.yaml"
    scn.write_text(f"workload: {{kind: trace, path: {path}, format: servesim}}\n")
    return scn


# -- numbers parse the same in --set, --grid and YAML ------------------------------------------------------------
def test_scientific_notation_is_a_number_everywhere(tmp_path):
    assert load_scenario(REPO / "examples/infermax-default.yaml", ["memory.M=1e5"]).memory.M == 100000
    y = tmp_path / "s.yaml"
    y.write_text("memory: {M: 1e5}\n")                 # YAML 1.1 would read this as the string '1e5'
    assert load_scenario(y).memory.M == 100000
    from study.sweep import parse_value
    assert parse_value("1e5") == 100000


@pytest.mark.parametrize("value,fragment", [("nan", "slo.ttft_s"), ("inf", "slo.ttft_s"), ("abc", "slo.ttft_s")])
def test_non_finite_or_text_slo_values_are_one_line(capsys, value, fragment):
    one_line_error(capsys, ["run", "examples/poisson-10k.yaml", *SMALL, "--set", f"slo.ttft_s={value}"], fragment)


def test_empty_key_and_list_values_in_set(capsys):
    one_line_error(capsys, ["run", "examples/poisson-10k.yaml", "--set", "=3"], "--set")
    one_line_error(capsys, ["run", "examples/poisson-10k.yaml", "--set", "workload..rate=3"], "--set")
    one_line_error(capsys, ["run", "examples/poisson-10k.yaml", *SMALL, "--set", "memory.M=[1,2]"], "memory.M")


def test_a_repeated_grid_field_is_an_error(capsys, tmp_path):
    one_line_error(capsys, ["sweep", "examples/poisson-10k.yaml", "--grid", "seed=0,1", "--grid", "seed=2",
                            "--out", str(tmp_path / "s")], "seed", "--grid")


# -- scenario files -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,fragment", [
    ("latin1", "not UTF-8"), ("gzip", "gzip"), ("directory", "directory"), ("empty", "empty"),
    ("duplicate", "duplicate"), ("missing", "does not exist")])
def test_scenario_files_that_cannot_be_a_scenario(capsys, tmp_path, kind, fragment):
    p = tmp_path / "s.yaml"
    if kind == "latin1":
        p.write_bytes("name: caf\xe9\n".encode("latin-1"))
    elif kind == "gzip":
        p.write_bytes(gzip.compress(b"policy: {name: vllm}\n"))
    elif kind == "directory":
        p.mkdir()
    elif kind == "empty":
        p.write_text("\n# nothing here\n")
    elif kind == "duplicate":
        p.write_text("policy: {name: vllm}\npolicy: {name: sarathi}\n")
    one_line_error(capsys, ["run", str(p)], fragment, "s.yaml")


# -- trace files --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,content,fragments", [
    ("empty.csv", b"", ("empty.csv", "empty")),
    ("gz.csv", gzip.compress((HEADER + "0,10,5\n").encode()), ("gz.csv", "gzip")),
    ("latin.csv", (HEADER + "0,10,5\n1,caf\xe9,5\n").encode("latin-1"), ("latin.csv:3", "UTF-8")),
    ("extra.csv", (HEADER + "0,10,5,1\n1,10,5,2\n").encode(), ("extra.csv:2", "4 fields", "3 columns")),
    ("extra1.csv", (HEADER + "0,10,5\n1,10,5,2\n").encode(), ("extra1.csv:3", "4 fields")),
    ("inf.csv", (HEADER + "0,10,5\ninf,10,5\n").encode(), ("inf.csv:3", "arrival_s", "finite")),
    ("huge.csv", (HEADER + "0,10,5\n1e300,10,5\n").encode(), ("huge.csv:3", "arrival_s", "time_unit")),
    ("blank.csv", (HEADER + "0,10,5\n\n\n1,x,5\n").encode(), ("blank.csv:5", "prompt_tokens")),
])
def test_trace_files_name_the_file_and_line(capsys, tmp_path, name, content, fragments):
    one_line_error(capsys, ["run", str(_trace_scenario(tmp_path, name, content))], *fragments)


def test_a_trace_path_that_is_a_directory(capsys, tmp_path):
    one_line_error(capsys, ["run", str(_trace_scenario(tmp_path, "d.csv", directory=True))], "is a directory")


def test_a_blank_line_inside_a_good_trace_changes_nothing(tmp_path):
    from traces.loaders import load_trace
    a = tmp_path / "a.csv"
    b = tmp_path / "b.csv"
    a.write_text(HEADER + "0,10,5\n1,12,6\n")
    b.write_text(HEADER + "0,10,5\n\n1,12,6\n")
    assert load_trace(a, "servesim").equals(load_trace(b, "servesim"))


# -- output places ------------------------------------------------------------------------------------------------
def test_out_naming_a_file_or_an_impossible_place(capsys, tmp_path):
    f = tmp_path / "taken"
    f.write_text("x")
    one_line_error(capsys, ["run", "examples/poisson-10k.yaml", *SMALL, "--out", str(f)], "existing file")
    one_line_error(capsys, ["run", "examples/poisson-10k.yaml", *SMALL, "--out", str(f / "sub")], "taken")
    one_line_error(capsys, ["trace", "make", "examples/workload-gamma-burst.yaml", "-o", str(tmp_path)], "folder")
    one_line_error(capsys, ["trace", "make", "examples/workload-gamma-burst.yaml", "-o", str(f / "t.csv")], "taken")


# -- the last line of defence -------------------------------------------------------------------------------------
@pytest.mark.parametrize("exc,fragment", [
    (OSError(28, "No space left on device", "/some/file"), "/some/file: No space left on device"),
    (PermissionError(13, "Permission denied", "/etc/x"), "/etc/x: Permission denied"),
    (IsADirectoryError(21, "Is a directory", "out"), "out: Is a directory"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not UTF-8"),
])
def test_any_os_or_decoding_error_in_any_command_is_one_line(capsys, monkeypatch, exc, fragment):
    """Every subcommand runs through main's one dispatch: whatever OS or decoding error escapes a command (a full
    disk, a permission, a file that is a folder), the user sees one line, never a traceback."""
    import argparse
    import sim.cli as cli
    commands = cli.build_parser()._subparsers._group_actions[0].choices
    assert {"run", "sweep", "capacity", "plan", "optimal", "trace", "plot", "validate", "reproduce"} <= set(commands)

    def boom(args):
        raise exc
    for name in commands:
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args",
                            lambda self, argv=None, namespace=None: argparse.Namespace(command=name, func=boom))
        one_line_error(capsys, [name], fragment)


def test_piping_into_head_is_silent():
    p = subprocess.run(f"{sys.executable} -m sim.cli policies | head -1", shell=True, cwd=REPO, capture_output=True,
                       text=True)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr


# -- the first thing typed: every help screen renders ------------------------------------------------------------
def _parsers(parser, path=()):
    import argparse
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + (name,))


def test_every_help_screen_renders():
    """`servesim --help` and every subcommand's (argparse %-expands help strings: a bare % in one, as in
    "95% interval", made the top-level help a traceback)."""
    from sim.cli import build_parser
    screens = list(_parsers(build_parser()))
    assert len(screens) > 15
    for path, parser in screens:
        text = parser.format_help()
        assert text.startswith("usage: servesim"), path
    top = " ".join(screens[0][1].format_help().split())
    assert "with its 95% interval" in top


@pytest.mark.parametrize("command", [["sweep", "examples/speculative.yaml", "--grid", "workload.rate=1,2"],
                                     ["capacity", "examples/speculative.yaml"], ["validate"],
                                     ["plan", "examples/cluster-plan.yaml", "--rate", "2"]])
@pytest.mark.parametrize("jobs,message", [("0", "--jobs: must be >= 1 (worker processes), got 0"),
                                          ("-2", "--jobs: must be >= 1 (worker processes), got -2"),
                                          ("two", "--jobs: expected an integer, got 'two'")])
def test_jobs_below_one_is_refused_by_every_command_that_takes_it(capsys, command, jobs, message):
    """--jobs 0 or a negative count ran serially without a word in capacity, plan and validate (sweep refused it
    only after loading the sweep): one line now, before anything is read or run."""
    assert one_line_error(capsys, [*command, "--jobs", jobs]) == f"servesim: error: {message}"
