"""A mistyped `tokenspeed serve` flag names the flag that was probably meant."""

import pytest

from tokenspeed.config.cli import prepare_server_args


@pytest.mark.parametrize(
    "typo,meant",
    [("--tpp", "--tp"), ("--enable-metric", "--enable-metrics"), ("--max-num-seq", "--max-num-seqs")],
)
def test_unknown_flag_suggests_the_closest(typo, meant, capsys):
    with pytest.raises(SystemExit) as exc:
        prepare_server_args(["/models/x", "--device", "cpu", typo, "4"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{typo}: did you mean {meant}?" in err


def test_unrelated_flag_gets_no_guess(capsys):
    with pytest.raises(SystemExit):
        prepare_server_args(["/models/x", "--device", "cpu", "--zzzzzz"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err
