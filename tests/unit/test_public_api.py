import pgqueue


def test_all_is_sorted_and_complete() -> None:
    assert pgqueue.__all__ == sorted(pgqueue.__all__)
    for name in pgqueue.__all__:
        assert hasattr(pgqueue, name), name
    public = {n for n in dir(pgqueue) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(pgqueue.__all__)
