"""A PoolChoice carries the token a client sends, and never shows it."""

from __future__ import annotations

from gpupool.workload.client.resolve import PoolChoice


def test_the_token_is_in_no_repr_or_str_of_a_choice():
    choice = PoolChoice("https://pool:8470", "--server", "s3cret-token", "$GPUPOOL_TOKEN", "/ca.crt", "client.yaml")
    assert choice.token == "s3cret-token"
    for text in (repr(choice), str(choice), f"{choice}", repr([choice])):
        assert "s3cret" not in text
        assert "https://pool:8470" in text and "$GPUPOOL_TOKEN" in text
