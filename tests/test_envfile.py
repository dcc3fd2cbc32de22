"""The accepted syntax of a layer file, one rule per test id, exact error texts."""

from __future__ import annotations

from pathlib import Path

import pytest

from envlayers.envfile import Ref, parse_text
from envlayers.errors import LayerSyntaxError


def one(text: str):
    (a,) = parse_text(text, "l.env")
    return a.key, a.value


@pytest.mark.parametrize(
    "text, key, value",
    [
        pytest.param("A=b", "A", ("b",), id="plain"),
        pytest.param("export A=b", "A", ("b",), id="export-prefix"),
        pytest.param("  A=b  # why", "A", ("b",), id="indent-and-trailing-comment"),
        pytest.param("A=", "A", (), id="empty-value-is-present-and-empty"),
        pytest.param("A=''", "A", (), id="empty-single-quotes"),
        pytest.param("A=a#b", "A", ("a#b",), id="hash-inside-word-is-literal"),
        pytest.param("A='x $Y \"z\"'", "A", ('x $Y "z"',), id="single-quotes-are-literal"),
        pytest.param('A="x \\$Y \\"z\\" \\n"', "A", ('x $Y "z" \\n',), id="double-quote-escapes"),
        pytest.param("A='line1\nline2'", "A", ("line1\nline2",), id="quoted-newline"),
        pytest.param("A=$B", "A", (Ref("B"),), id="bare-reference"),
        pytest.param("A=${B}c", "A", (Ref("B"), "c"), id="braced-reference"),
        pytest.param("A=${B-d}", "A", (Ref("B", "-", ("d",)),), id="dash-default"),
        pytest.param("A=${B:-d e}", "A", (Ref("B", ":-", ("d e",)),), id="colon-dash-default"),
        pytest.param("A=${B:-$C/x}", "A", (Ref("B", ":-", (Ref("C"), "/x")),), id="reference-in-default"),
        pytest.param("A=a$", "A", ("a$",), id="lone-dollar-is-literal"),
        pytest.param("A=x\\ y", "A", ("x y",), id="backslash-escape-unquoted"),
        pytest.param("A=x~y", "A", ("x~y",), id="tilde-inside-word-is-literal"),
        pytest.param("A=\"~\"", "A", ("~",), id="quoted-tilde"),
        pytest.param("A=*?[x]", "A", ("*?[x]",), id="no-globbing-in-assignments"),
    ],
)
def test_accepted(text, key, value):
    assert one(text) == (key, value)


def test_comments_and_blank_lines_are_skipped():
    assert [a.key for a in parse_text("# c\n\n   \nA=1\n  # c2\nB=2\n")] == ["A", "B"]


def test_origin_is_the_first_line_of_a_multiline_statement():
    a, b = parse_text("A='x\ny'\nB=1\n", "l.env")
    assert (str(a.origin), str(b.origin)) == ("l.env:1", "l.env:3")


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param("A=$(date +%s)", "l.env:1: command substitution '$(date +%s)' is not accepted",
                     id="command-substitution"),
        pytest.param("A=`date`", "l.env:1: command substitution with backticks is not accepted", id="backticks"),
        pytest.param('A="`date`"', "l.env:1: command substitution with backticks is not accepted",
                     id="backticks-in-double-quotes"),
        pytest.param("A=$((1+2))", "l.env:1: arithmetic expansion '$((1+2))' is not accepted", id="arithmetic"),
        pytest.param("A=${B:=d}", "l.env:1: unsupported parameter expansion '${B:=...}'", id="assign-default"),
        pytest.param("A=${B:+x}", "l.env:1: unsupported parameter expansion '${B:+...}'", id="alternate-value"),
        pytest.param("A=${#B}", "l.env:1: unsupported parameter expansion '${#B}'", id="length"),
        pytest.param("A=$1", "l.env:1: special parameter '$1' is not accepted", id="positional"),
        pytest.param("A=x \\\nB=1", "l.env:1: line continuation (backslash at end of line) is not accepted",
                     id="trailing-backslash"),
        pytest.param("export A", "l.env:1: 'export A' exports without assigning", id="export-without-value"),
        pytest.param("\ufeffA=1", "l.env:1: the file starts with a byte-order mark (BOM)", id="byte-order-mark"),
        pytest.param("_=x", "l.env:1: '_' is a bash special variable and cannot be set from a layer",
                     id="underscore-special"),
        pytest.param("OPTIND=1", "l.env:1: 'OPTIND' is a bash special variable and cannot be set from a layer",
                     id="optind-special"),
        pytest.param("A=x\\\ny", "l.env:1: line continuation (backslash at end of line) is not accepted",
                     id="line-continuation"),
        pytest.param("unset A", "l.env:1: 'unset A' is not accepted: a layer can override a key, never unset it",
                     id="unset"),
        pytest.param("source other.env", "l.env:1: not an assignment: 'source other.env'", id="source"),
        pytest.param("FOO", "l.env:1: not an assignment: 'FOO'", id="bare-word"),
        pytest.param("A = 1", "l.env:1: space around '=' in 'A = 1'", id="space-around-equals"),
        pytest.param("A+=x", "l.env:1: append assignment 'A+=x' is not accepted", id="append"),
        pytest.param("A=1 B=2", "l.env:1: unexpected text after the value of A: 'B=2'", id="two-assignments"),
        pytest.param("A=1; B=2", "l.env:1: unquoted ';' is not accepted in a value", id="semicolon"),
        pytest.param("A='x", "l.env:1: unterminated single quote", id="unterminated-single"),
        pytest.param('\nA="x\n', "l.env:2: unterminated double quote", id="unterminated-double"),
        pytest.param("A=~/x", "l.env:1: unquoted '~' would be tilde-expanded by bash", id="tilde"),
        pytest.param("A=a:~/x", "l.env:1: unquoted '~' would be tilde-expanded by bash", id="tilde-after-colon"),
        pytest.param("A=$'x'", "l.env:1: ANSI-C quoting $'...' is not accepted", id="ansi-c-quoting"),
        pytest.param("A=x\r", "l.env:1: carriage return in line (CRLF line endings)", id="crlf"),
        pytest.param("RANDOM=1", "l.env:1: 'RANDOM' is a bash special variable and cannot be set from a layer",
                     id="bash-special"),
        pytest.param("A=${B-'x'}", "l.env:1: ''' inside the default of ${B-...} is not accepted",
                     id="quote-in-default"),
        pytest.param("if true; then A=1; fi", "l.env:1: not an assignment: 'if true; then A=1; fi'", id="compound"),
    ],
)
def test_rejected_with_file_line_and_hint(text, message):
    with pytest.raises(LayerSyntaxError) as err:
        parse_text(text, "l.env")
    text_out = str(err.value)
    assert text_out.split("; hint: ")[0] == message
    assert "; hint: " in text_out


def test_every_error_is_one_line():
    with pytest.raises(LayerSyntaxError) as err:
        parse_text("A='a\nb\nc", "l.env")
    assert "\n" not in str(err.value)


# -- keys a layer may not assign -----------------------------------------------------------------

@pytest.mark.parametrize("key, why", [
    pytest.param("BASH_ENV", "bash runs the file it names", id="bash-env"),
    pytest.param("ENV", "POSIX mode run the file", id="env"),
    pytest.param("PS4", "`set -x` traces", id="ps4"),
    pytest.param("PS1", "at every prompt", id="ps1"),
    pytest.param("PROMPT_COMMAND", "runs it as a command", id="prompt-command"),
    pytest.param("SHELLOPTS", "shell options", id="shellopts"),
    pytest.param("BASHOPTS", "shopt options", id="bashopts"),
    pytest.param("LD_PRELOAD", "loads the libraries it names", id="ld-preload"),
    pytest.param("LD_AUDIT", "audit libraries", id="ld-audit"),
    pytest.param("GCONV_PATH", "conversion modules", id="gconv-path"),
    pytest.param("PYTHONSTARTUP", "Python runs the file", id="pythonstartup"),
    # the launcher's own Python runs after the layers are exported: a sitecustomize.py in a folder another
    # user can write would run as the job's owner
    pytest.param("PYTHONPATH", "runs a sitecustomize.py", id="pythonpath"),
    pytest.param("PYTHONHOME", "standard library", id="pythonhome"),
    pytest.param("PYTHONUSERBASE", "usercustomize.py", id="pythonuserbase"),
    pytest.param("LD_LIBRARY_PATH", "before the system's", id="ld-library-path"),
    pytest.param("PYTHONPYCACHEPREFIX", "compiled modules", id="pythonpycacheprefix"),
    # Python's user site folder is under $HOME: a usercustomize.py or a .pth file there runs in the launcher
    pytest.param("HOME", "usercustomize.py", id="home"),
    # the job's own variables: a chain of 50 successors, a rank every node runs, another user's key file
    pytest.param("ENVLAYERS_CHAIN_LEFT", "the successor chain", id="chain-left"),
    pytest.param("ENVLAYERS_CHAIN_KEY_FILE", "the key file a successor keeps", id="chain-key-file"),
    pytest.param("ENVLAYERS_RANK", "each rank's number", id="rank"),
    pytest.param("ENVLAYERS_READY_TIMEOUT_S", "the readiness budget", id="ready-timeout-the-job-sets"),
])
def test_keys_that_run_code_are_refused_with_reason_and_alternative(key, why):
    with pytest.raises(LayerSyntaxError) as err:
        parse_text(f"A=1\nexport {key}=/tmp/x\n", "l.env")
    text = str(err.value)
    assert text.startswith(f"l.env:2: '{key}' is refused in a layer: ") and why in text and "; hint: " in text


@pytest.mark.parametrize("key", ["PATH", "HF_HOME", "ENVLAYERS_HSN_IFACE", "ENVLAYERS_RANK_START_TIMEOUT"])
def test_search_path_and_launch_keys_stay_allowed(key):
    assert one(f"{key}=/opt/x:$HOME")[0] == key


def test_refused_table_is_the_one_the_catalog_checks():
    from envlayers.envfile import REFUSED, refusal

    assert {"BASH_ENV", "LD_PRELOAD", "IFS"} <= set(REFUSED)
    assert all(refusal(name) is not None for name in REFUSED)


def test_unreadable_layer_file_is_a_clear_error(tmp_path):
    import os

    from envlayers.envfile import parse_file

    folder = tmp_path / "a-folder.env"
    folder.mkdir()
    with pytest.raises(LayerSyntaxError) as err:
        parse_file(folder, "a-folder.env")
    assert str(err.value).startswith("a-folder.env: cannot read the layer file: Is a directory")
    if os.geteuid() != 0:  # root reads a 000 file all the same
        locked = tmp_path / "locked.env"
        locked.write_text("A=1\n")
        locked.chmod(0)
        with pytest.raises(LayerSyntaxError, match="Permission denied"):
            parse_file(locked, "locked.env")


# -- Slurm's own inputs ------------------------------------------------------------------------------

@pytest.mark.parametrize("key, why", [
    pytest.param("SLURM_TASK_PROLOG", "SLURM_TASK_PROLOG and SLURM_TASK_EPILOG run a program", id="task-prolog"),
    pytest.param("SLURM_TASK_EPILOG", "SLURM_TASK_PROLOG and SLURM_TASK_EPILOG run a program", id="task-epilog"),
    pytest.param("SLURM_NTASKS", "srun reads SLURM_* variables as its options", id="slurm-option"),
    pytest.param("SLURM_CONF", "srun reads SLURM_* variables as its options", id="slurm-conf"),
    pytest.param("SLURM_JOB_ID", "Slurm sets the job's own SLURM_*", id="slurm-output-variable"),
    pytest.param("SRUN_CPUS_PER_TASK", "srun reads SRUN_* variables", id="srun-option"),
    pytest.param("SBATCH_TIMELIMIT", "sbatch reads SBATCH_* variables", id="sbatch-timelimit"),
    pytest.param("SBATCH_ACCOUNT", "sbatch reads SBATCH_* variables", id="sbatch-account"),
    pytest.param("SALLOC_PARTITION", "salloc reads SALLOC_* variables", id="salloc-option"),
])
def test_slurm_input_variables_are_refused_with_reason_and_alternative(key, why):
    with pytest.raises(LayerSyntaxError) as err:
        parse_text(f"A=1\n{key}=/tmp/x\n", "l.env")
    text = str(err.value)
    assert text.startswith(f"l.env:2: '{key}' is refused in a layer: ") and why in text and "; hint: " in text
    assert "\n" not in text


@pytest.mark.parametrize("text", ["SLURM_PARTITION=mi300\n", "SLURM_PARTITION=\n", "export SLURM_PARTITION=a,b\n",
                                  "X=$SLURM_JOB_ID/${SLURM_CPUS_ON_NODE:-1}\n", "SLURMISH=1\n", "MY_SLURM_X=1\n"])
def test_what_the_launcher_passes_on_and_references_to_slurm_variables_stay_allowed(text):
    assert len(parse_text(text, "l.env")) == 1


def test_every_slurm_name_the_layers_assign_is_allowed_by_name():
    """The catalog's own layers assign SLURM_PARTITION and nothing else of Slurm's: the allow list holds
    exactly what the launcher knowingly passes on."""
    from pathlib import Path

    from envlayers.envfile import ALLOWED_SLURM, REFUSED_PREFIXES, parse_file

    layers = Path(__file__).resolve().parents[1] / "experiments" / "layers"
    assigned = {a.key for f in sorted(layers.glob("*.env")) for a in parse_file(f)}
    slurm_like = {k for k in assigned if k.startswith(tuple(REFUSED_PREFIXES))}
    assert slurm_like == set(ALLOWED_SLURM) == {"SLURM_PARTITION"}


# -- special files ------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_a_device_is_not_a_layer(device):
    from envlayers.envfile import parse_file

    with pytest.raises(LayerSyntaxError) as err:
        parse_file(Path(device), device)
    assert str(err.value).startswith(f"{device}: is a character device, not a regular file; hint: ")


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path):
    import os

    from envlayers.envfile import parse_file

    fifo = tmp_path / "layer.env"
    os.mkfifo(fifo)  # opening it for reading the ordinary way would wait for a writer for ever
    with pytest.raises(LayerSyntaxError, match=r"layer.env: is a FIFO, not a regular file"):
        parse_file(fifo, "layer.env")


def test_a_layer_larger_than_the_setups_limit_is_refused(tmp_path):
    from envlayers.envfile import parse_file
    from envlayers.yamlpos import MAX_BYTES

    big = tmp_path / "big.env"
    big.write_text("A=" + "x" * MAX_BYTES + "\n")
    with pytest.raises(LayerSyntaxError, match=rf"big.env: is {MAX_BYTES + 3} bytes, more than the {MAX_BYTES}"):
        parse_file(big, "big.env")
    at_limit = tmp_path / "ok.env"
    at_limit.write_text("A=" + "x" * (MAX_BYTES - 3) + "\n")
    assert len(parse_file(at_limit)[0].value[0]) == MAX_BYTES - 3
