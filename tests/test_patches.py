"""tunecache.patching: the ledger every Inductor patch goes through."""

from __future__ import annotations

import pytest

from tunecache.patching import ABSENT, Ledger


class Base:
    def method(self) -> str:
        return "base"


class Owner(Base):
    @staticmethod
    def helper() -> str:
        return "own"


def test_an_attribute_that_was_absent_is_absent_again_after_undo():
    ledger = Ledger()
    obj = Owner()
    assert ledger.patch(Owner, "method", lambda self: "ours") is ABSENT  # inherited
    assert ledger.patch(obj, "extra", 1) is ABSENT
    assert obj.method() == "ours" and obj.extra == 1
    ledger.undo()
    assert "method" not in vars(Owner) and obj.method() == "base"
    assert not hasattr(obj, "extra")


def test_undo_puts_back_the_owners_own_object_not_what_attribute_access_returns():
    ledger = Ledger()
    own = vars(Owner)["helper"]
    assert ledger.patch(Owner, "helper", staticmethod(lambda: "ours")) is own
    assert Owner.helper() == "ours"
    ledger.undo()
    assert vars(Owner)["helper"] is own


def test_changes_are_undone_newest_first():
    ledger = Ledger()
    obj = Owner()
    obj.value = "original"
    ledger.patch(obj, "value", "first")
    ledger.patch(obj, "value", "second")
    ledger.undo()
    assert obj.value == "original"  # oldest first would leave "first"


def test_undo_since_a_mark_keeps_what_came_before_it():
    ledger = Ledger()
    obj = Owner()
    ledger.patch(obj, "a", 1)
    mark = ledger.mark()
    ledger.patch(obj, "b", 2)
    ledger.patch(obj, "a", 3)
    ledger.undo(mark)
    assert (obj.a, hasattr(obj, "b"), len(ledger)) == (1, False, 1)
    ledger.undo()
    assert not hasattr(obj, "a") and len(ledger) == 0


def test_an_attribute_changed_since_is_left_as_it_is():
    ledger = Ledger()
    obj = Owner()
    obj.value = "original"
    ledger.patch(obj, "value", "ours")
    obj.value = "theirs"
    ledger.undo()
    assert obj.value == "theirs"


def test_a_failed_undo_still_undoes_the_rest_then_raises():
    class Sticky:
        def __delattr__(self, name: str) -> None:
            raise RuntimeError("cannot delete")

    ledger = Ledger()
    sticky, obj = Sticky(), Owner()
    ledger.patch(obj, "a", 1)
    ledger.patch(sticky, "b", 2)
    with pytest.raises(RuntimeError):
        ledger.undo()
    assert not hasattr(obj, "a") and len(ledger) == 0


def test_a_set_that_fails_is_not_recorded():
    class Frozen:
        __slots__ = ()

    ledger = Ledger()
    with pytest.raises(AttributeError):
        ledger.patch(Frozen(), "a", 1)
    assert len(ledger) == 0


def test_config_settings_are_restored_by_value_and_never_deleted():
    pytest.importorskip("torch")
    from torch._inductor import config

    ledger = Ledger()
    with config.patch(compile_threads=3):
        assert ledger.patch(config, "compile_threads", 1) == 3
        assert config.compile_threads == 1
        ledger.undo()
        assert config.compile_threads == 3
    with pytest.raises(AttributeError):
        ledger.patch(config, "no_such_setting_anywhere", 1)
    assert len(ledger) == 0


def test_a_scoped_ledger_undoes_on_exit():
    obj = Owner()
    with Ledger() as ledger:
        ledger.patch(obj, "a", 1)
        assert obj.a == 1
    assert not hasattr(obj, "a")
