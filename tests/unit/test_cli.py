"""The argparse command line, in process: which arguments are syncscope's, which the program's."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from syncscope import cli


def parse(*argv: str) -> dict[str, object]:
    namespace, extras = cli.build_parser().parse_known_args(list(argv))
    assert extras == []
    return vars(namespace)


@pytest.mark.parametrize(
    ("argv", "module", "program"),
    [
        (["s.py", "--foo", "-q"], None, ["s.py", "--foo", "-q"]),
        (["--quiet", "s.py", "--out", "x", "-m", "y"], None, ["s.py", "--out", "x", "-m", "y"]),
        (["-o", "d", "--", "s.py", "--", "a"], None, ["s.py", "--", "a"]),
        (["-oDIR", "--out=d", "s.py"], None, ["s.py"]),
        (["-m", "pkg.train", "--lr", "3"], "pkg.train", ["--lr", "3"]),
        (["-m", "pkg.train", "--", "--lr", "3"], "pkg.train", ["--lr", "3"]),
        (["-mpkg.train", "--out", "x"], "pkg.train", ["--out", "x"]),
        (["--module=pkg.train", "-q"], "pkg.train", ["-q"]),
        (["--module", "pkg.train", "-h"], "pkg.train", ["-h"]),
        (["-qm", "pkg.train", "-q"], "pkg.train", ["-q"]),
        ([], None, []),
    ],
)
def test_profile_program_arguments(argv: list[str], module: str | None, program: list[str]) -> None:
    args = parse("profile", "--nproc-per-node", "2", *argv)
    assert (args["module"], args["program"], args["nproc_per_node"]) == (module, program, "2")


def test_profile_options_and_launcher_spellings() -> None:
    args = parse(
        "profile", "-q", "--hang-timeout", "1.5", "--nproc_per_node", "3", "--standalone", "s.py"
    )
    assert args["quiet"] is True and args["standalone"] is True
    assert args["hang_timeout"] == 1.5 and args["nproc_per_node"] == "3"
    assert args["fail_on"] == "error" and args["out"] is None


def test_fix_options_and_script_arguments_mix() -> None:
    args = parse("fix", "train.py", "--apply", "a", "--nproc-per-node", "4", "b")
    assert (args["script"], args["program"], args["apply"]) == (Path("train.py"), ["a", "b"], True)
    assert args["nproc_per_node"] == 4
    assert parse("fix", "train.py", "--verify", "--", "--lr", "3")["program"] == ["--lr", "3"]


@pytest.mark.parametrize(
    ("argv", "program", "verify"),
    [
        # SCRIPT's own options after SCRIPT, without --, as with profile
        (["--verify", "s.py", "--cpu"], ["--cpu"], True),
        (["--verify", "s.py", "--steps", "2", "-q"], ["--steps", "2", "-q"], True),
        (["s.py", "--steps", "2", "--verify", "--lr=3"], ["--steps", "2", "--lr=3"], True),
        (["s.py", "-h", "--help"], ["-h", "--help"], False),
        (["s.py", "--", "--verify", "--apply"], ["--verify", "--apply"], False),
        (["--nproc-per-node=3", "s.py", "x", "--style", "flag", "y"], ["x", "y"], False),
    ],
)
def test_fix_takes_the_script_arguments_after_script(
    argv: list[str], program: list[str], verify: bool
) -> None:
    args = parse("fix", *argv)
    assert (args["script"], args["program"], args["verify"]) == (Path("s.py"), program, verify)


def test_fix_unknown_option_before_script_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["fix", "--cpu", "s.py"]) == 2
    assert "unrecognized arguments: --cpu" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "color"), [([], None), (["--color"], True), (["--no-color"], False)]
)
def test_diff_color_is_tri_state(flag: list[str], color: bool | None) -> None:
    assert parse("diff", "a", "b", *flag)["color"] is color


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, needle in (
        (["profile", "--hang-timeout", "abc", "s.py"], "argument --hang-timeout: invalid float"),
        (["profile", "--nproc-per-nod", "2", "s.py"], "unrecognized arguments: --nproc-per-nod"),
        (["report", "r", "-f", "xml"], "invalid choice: 'xml'"),
        (["analyze", "--quiet"], "required: PATH"),
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("syncscope: error: "), err
        assert needle in err and f"(see 'syncscope {argv[0]} --help')" in err


def test_help_and_no_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["fix", "--help"]) == 0
    out = capsys.readouterr()
    assert "--nproc-per-node N" in out.out and out.err == ""
    assert cli.main([]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("usage: syncscope")


def test_unknown_option_or_command_before_any_command(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, needle in ((["--nope"], "unknown option --nope"), (["bogus"], "'bogus'")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err and "(see 'syncscope --help')" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import syncscope
    from syncscope import cli

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"syncscope {syncscope.__version__}"


def test_package_is_marked_typed() -> None:
    from pathlib import Path

    import syncscope

    assert (Path(syncscope.__file__).parent / "py.typed").is_file()


# profile's launcher options: torch.distributed.run's own parser is the one list --------------


def _torchrun_options() -> list[tuple[argparse.Action, str]]:
    from torch.distributed.run import get_args_parser

    return [
        (action, option)
        for action in get_args_parser()._actions
        for option in action.option_strings
        if option not in ("-h", "--help")
    ]


def _a_value(action: argparse.Action) -> str:
    """A value torchrun's parser accepts for ``action``."""
    if action.choices is not None:
        return str(list(action.choices)[-1])
    return {int: "3", float: "0.5"}.get(action.type, "a,b")  # type: ignore[call-overload]


def test_every_torchrun_option_passes_through_unchanged() -> None:
    from syncscope.launch.torchrun import REFUSED

    torchrun = __import__("torch.distributed.run", fromlist=["get_args_parser"]).get_args_parser()
    checked = 0
    for action, option in _torchrun_options():
        if option in ("-m", "--module") or action.dest in {
            "no_python",
            "run_path",
            "print_completion",
        }:
            continue  # syncscope's own -m MODULE; refused (next test)
        given = [option] if action.nargs == 0 else [option, _a_value(action)]
        args = parse("profile", *given, "s.py", "--lr", "3")
        assert args["program"] == ["s.py", "--lr", "3"], option
        launcher = args["launcher"]
        assert [(d, o) for d, o, _ in launcher.given] == [(action.dest, option)], option
        # torchrun reads what syncscope passes on exactly as it reads the option given to it
        forwarded = launcher.torchrun_args()  # (with --standalone where nothing says where)
        expected = vars(torchrun.parse_args([*given, "s.py"]))[action.dest]
        assert vars(torchrun.parse_args([*forwarded, "s.py"]))[action.dest] == expected, option
        assert args[action.dest] == expected, option
        checked += 1
    # every spelling of the passed-through options (torch 2.6 and 2.7: 37, 2.8: 39, 2.13: 50
    # and more)
    import torch

    release = tuple(int(x) for x in torch.__version__.split(".")[:2])
    assert checked >= (39 if release >= (2, 8) else 37)
    assert set(REFUSED) == {"--no-python", "--run-path", "--print-completion"}


def test_torchruns_print_completion_is_refused_where_torch_has_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN: torch 2.15's torchrun option that prints a shell completion script and exits
    if not any(o == "--print-completion" for _, o in _torchrun_options()):
        pytest.skip("this torch's torchrun has no --print-completion (torch 2.15 has it)")
    # WHEN / THEN: refused in one line, never handed to torchrun (nothing would run)
    assert cli.main(["profile", "--print-completion", "bash", "s.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shell completion" in err


@pytest.mark.parametrize("option", ["--no-python", "--no_python", "--run-path", "--run_path"])
def test_torchrun_options_that_make_no_sense_are_refused_in_one_line(
    option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["profile", option, "s.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("syncscope: error: argument ")
    assert "not under syncscope: " in err and "syncscope.launch.attach" in err


def test_syncscope_takes_torchrun_module_flag_as_its_own_module_option() -> None:
    args = parse("profile", "--tee", "3", "-m", "pkg.train", "--tee", "1")
    assert (args["module"], args["program"], args["tee"]) == ("pkg.train", ["--tee", "1"], "3")


def test_launcher_values_are_checked_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, needle in (
        (["--max-restarts", "x", "s.py"], "argument --max-restarts/--max_restarts: invalid int"),
        (["--start-method", "thread", "s.py"], "invalid choice: 'thread'"),
        (["--tee"], "argument -t/--tee: expected one argument"),
    ):
        assert cli.main(["profile", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
        assert "(see 'syncscope profile --help')" in err


def test_launcher_options_keep_the_users_spelling() -> None:
    args = parse("profile", "-t3", "--local_ranks_filter=0", "-r", "", "--standalone", "s.py")
    assert args["launcher"].torchrun_args() == [
        "-t3",
        "--local_ranks_filter=0",
        "-r",
        "",
        "--standalone",
    ]
    assert args["launcher"].values == {
        "tee": "3",
        "local_ranks_filter": "0",
        "redirects": "",
        "standalone": "true",
    }
    assert parse("profile", "s.py")["launcher"].torchrun_args() == ["--standalone"]
    assert parse("profile", "--nnodes", "2", "s.py")["launcher"].torchrun_args() == ["--nnodes=2"]


def test_profile_help_lists_syncscope_and_every_torchrun_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["profile", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--hang-timeout SECONDS" in out and "Launcher (torch.distributed.run)" in out
    for _, option in _torchrun_options():
        assert f"  {option}" in out or f", {option}" in out, option
