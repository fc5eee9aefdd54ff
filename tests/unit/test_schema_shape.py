"""A storage keeps a "yes" about its schema's shape and asks again after a "no" (orchestration.dagster_schema_shape)."""

from orchestration.dagster_schema_shape import RunSchemaShape


class _Catalog:
    def __init__(self, answers: list[bool]):
        self.answers, self.asked = answers, 0

    def has_run_stats_index_cols(self) -> bool:
        self.asked += 1
        return self.answers.pop(0)


class _Storage(RunSchemaShape, _Catalog):
    pass


def test_a_yes_is_kept_and_a_no_is_asked_again():
    storage = _Storage([False, False, True, False])
    assert [storage.has_run_stats_index_cols() for _ in range(5)] == [False, False, True, True, True]
    assert storage.asked == 3  # a migration that lands beside a live process is seen; once seen, never asked again


def test_each_storage_keeps_its_own_answers():
    first, second = _Storage([True]), _Storage([False])
    assert first.has_run_stats_index_cols() and not second.has_run_stats_index_cols()
