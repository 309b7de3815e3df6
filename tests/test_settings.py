"""TUNECACHE_* variables: parsed and validated in one place, with one-line errors."""

from __future__ import annotations

import pytest

from tunecache.errors import ConfigError
from tunecache.settings import RENAMED, Levers, Settings, resolve_db_url
from tunecache.settings import SHARE_ITEMS as SHARE


def test_unset_db_is_the_embedded_default_under_xdg_cache_home(tmp_path):
    settings = Settings.from_env({"XDG_CACHE_HOME": str(tmp_path)})
    assert settings.db_url == f"sqlite:///{tmp_path}/tunecache/tunecache.db"


@pytest.mark.parametrize(
    ("value", "url"),
    [
        ("/shared/tune.db", "sqlite:////shared/tune.db"),
        ("sqlite:////shared/tune.db", "sqlite:////shared/tune.db"),
        ("postgresql://u:pw@db:5432/tune", "postgresql+psycopg://u:pw@db:5432/tune"),
        ("postgres://db/tune", "postgresql+psycopg://db/tune"),
    ],
)
def test_db_accepts_paths_and_urls(value, url):
    assert resolve_db_url(value) == url


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TUNECACHE_DB": "  "}, "TUNECACHE_DB='  ' is invalid"),
        ({"TUNECACHE_DB": "sqlite://"}, "a SQLite URL naming a file"),
        ({"TUNECACHE_DB": "redis://cache/0"}, "not redis://"),
        ({"TUNECACHE_DB": "postgresql://host:notaport/db"}, "TUNECACHE_DB="),
        ({"TUNECACHE_MODE": "sometimes"}, "readwrite or readonly or off"),
        ({"TUNECACHE_LEASE_SECONDS": "-3"}, "a positive number of seconds"),
        ({"TUNECACHE_WAIT_TIMEOUT": "nan"}, "a positive number of seconds"),
        ({"TUNECACHE_MAX_ATTEMPTS": "2.5"}, "a positive whole number"),
        ({"TUNECACHE_SHARE": "triton,graph"}, "TUNECACHE_SHARE='triton,graph' is invalid"),
        ({"TUNECACHE_SHARE": "triton,-graphs"}, "(not both)"),
        ({"TUNECACHE_LEVERS": "+decisive_gemms"}, "TUNECACHE_LEVERS='+decisive_gemms'"),
        # the renamed variables, honoured, are still validated under their own names
        ({"TUNECACHE_TRITON_CONFIGS": "maybe"}, "expected 1 or 0"),
        ({"TUNECACHE_DECISIVE": "fusion,gemms"}, "expected 1, 0, or some of fusion,gemm,triton"),
        ({"TUNECACHE_DECISIVE": ","}, "TUNECACHE_DECISIVE=','"),
        ({"TUNECACHE_COMPILE_AHEAD": "-1"}, "expected 0 or a positive whole number"),
        ({"TUNECACHE_COMPILE_AHEAD": "four"}, "TUNECACHE_COMPILE_AHEAD='four'"),
    ],
)
def test_bad_settings_are_one_line_errors_that_name_the_variable(env, message):
    with pytest.raises(ConfigError) as error:
        Settings.from_env(env)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("value", "shared"), [
    ("", set(SHARE)),
    ("gemm", set()),
    ("triton, Transfer", {"triton", "transfer"}),
    ("-kernels,-profiles", set(SHARE) - {"kernels", "profiles"}),
    ("-kernels,+kernels", set(SHARE)),
])
def test_share_is_exactly_a_list_of_parts_or_edits_of_everything(value, shared):
    assert Settings.from_env({"TUNECACHE_SHARE": value}).share == shared
    assert Settings.from_env({}, share={"graphs"}).share == {"graphs"}


@pytest.mark.parametrize(("value", "decisive", "ahead"), [
    ("", {"gemm", "fusion"}, 8),
    ("+decisive_triton,-compile_ahead", {"gemm", "fusion", "triton"}, 0),
    ("decisive_fusion", {"fusion"}, 0),
])
def test_levers_take_the_same_list_grammar_over_their_measured_defaults(value, decisive,
                                                                        ahead):
    levers = Settings.from_env({"TUNECACHE_LEVERS": value}).levers
    assert (levers.decisive, levers.compile_ahead) == (decisive, ahead)
    assert not levers.user_kernel_transfer and not levers.user_kernel_regret
    assert Settings.from_env({}, levers=Levers(compile_ahead=2)).levers.compile_ahead == 2
    assert Settings.from_env({}, levers="+user_kernel_regret").levers.user_kernel_regret


@pytest.mark.parametrize(("env", "share", "levers", "notice"), [
    ({"TUNECACHE_TRITON_CONFIGS": "0"}, set(SHARE) - {"triton"}, Levers(),
     "TUNECACHE_TRITON_CONFIGS is renamed: set TUNECACHE_SHARE=-triton instead"),
    ({"TUNECACHE_PGO": "0", "TUNECACHE_KERNELS": "0"}, set(SHARE) - {"profiles", "kernels"},
     Levers(), "TUNECACHE_PGO is renamed: set TUNECACHE_SHARE=-profiles instead"),
    ({"TUNECACHE_DECISIVE": "1"}, set(SHARE), Levers(decisive=frozenset(
        {"gemm", "fusion", "triton"})), "TUNECACHE_DECISIVE is renamed"),
    ({"TUNECACHE_COMPILE_AHEAD": "2"}, set(SHARE), Levers(compile_ahead=2),
     "set TUNECACHE_LEVERS=+compile_ahead instead"),
    ({"TUNECACHE_USER_KERNEL_REGRET": "1"}, set(SHARE), Levers(user_kernel_regret=True),
     "set TUNECACHE_LEVERS=+user_kernel_regret instead"),
    # the new variable wins, and the old one is said to be ignored
    ({"TUNECACHE_GRAPHS": "0", "TUNECACHE_SHARE": "graphs"}, {"graphs"}, Levers(),
     "TUNECACHE_GRAPHS is replaced by TUNECACHE_SHARE, which is set: TUNECACHE_GRAPHS is "
     "ignored"),
])
def test_a_renamed_variable_is_honoured_with_a_notice_naming_its_replacement(
        env, share, levers, notice):
    settings = Settings.from_env(env)
    assert (settings.share, settings.levers) == (share, levers)
    assert any(notice in n for n in settings.notices), settings.notices
    assert len(settings.notices) == len(env) - ("TUNECACHE_SHARE" in env)


def test_every_renamed_variable_names_a_list_and_one_of_its_items():
    from tunecache.settings import LEVER_ITEMS, SHARE_ITEMS

    for new, item in RENAMED.values():
        assert item in (SHARE_ITEMS if new == "TUNECACHE_SHARE" else LEVER_ITEMS)


def test_keyword_settings_override_the_environment():
    settings = Settings.from_env({"TUNECACHE_MODE": "readonly", "TUNECACHE_LEASE_SECONDS": "9"},
                                 mode="off", db="/x.db")
    assert (settings.mode, settings.lease_seconds, settings.db_url) == ("off", 9.0,
                                                                       "sqlite:////x.db")


def test_unknown_keyword_setting_is_a_type_error():
    with pytest.raises(TypeError, match="lease"):
        Settings.from_env({}, lease=3)


def test_lock_timeout_defaults_to_half_the_lease_and_at_most_15_seconds():
    assert Settings.from_env({}).lock_timeout == 15.0
    assert Settings.from_env({"TUNECACHE_LEASE_SECONDS": "2"}).lock_timeout == 1.0
    assert Settings.from_env({"TUNECACHE_LEASE_SECONDS": "600"}).lock_timeout == 15.0


@pytest.mark.parametrize(
    "env",
    [
        {"TUNECACHE_LEASE_SECONDS": "2", "TUNECACHE_LOCK_TIMEOUT": "30"},
        {"TUNECACHE_LOCK_TIMEOUT": "16"},  # the default lease, 30 s
    ],
)
def test_lease_that_a_lock_wait_could_outlast_is_refused(env):
    # A heartbeat waits up to the lock timeout for its renewal (a writer stalled inside a
    # transaction holds every other back), so a live owner keeps its claim through every
    # stall the lock timeout tolerates only if lease/3 + lock_timeout < lease.
    with pytest.raises(ConfigError) as error:
        Settings.from_env(env)
    message = str(error.value)
    assert "TUNECACHE_LEASE_SECONDS" in message and "TUNECACHE_LOCK_TIMEOUT" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("env", "targets"),
    [
        ({"TUNECACHE_DB": "/t.db"}, {"triton.runtime.autotuner",
                                     "torch._inductor.runtime.autotune_cache",
                                     "torch._inductor.select_algorithm",
                                     "torch._inductor.choices"}),
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_SHARE": "-triton"},
         {"triton.runtime.autotuner", "torch._inductor.select_algorithm",
          "torch._inductor.choices"}),
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_SHARE": "-user_kernels"},
         {"torch._inductor.runtime.autotune_cache", "torch._inductor.select_algorithm",
          "torch._inductor.choices"}),
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_MODE": " OFF "}, set()),
        # a bad value: tunecache is off in the job (one line, tests/test_patches.py)
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_SHARE": "maybe"}, set()),
    ],
)
def test_autoload_waits_for_the_modules_of_the_parts_the_settings_want(
        env, targets, monkeypatch):
    from tunecache import switch
    from tunecache.process import PROCESS

    monkeypatch.setattr(PROCESS, "settings", None)
    for name in [n for n in __import__("os").environ if n.startswith("TUNECACHE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert set(switch.autoload()) == targets


def test_lease_longer_than_the_longest_honest_lease_is_refused():
    # Peers take a claim with a longer lease for one no tunecache wrote, and take it over.
    from tunecache.settings import MAX_LEASE_SECONDS

    assert Settings.from_env({"TUNECACHE_LEASE_SECONDS": str(MAX_LEASE_SECONDS)}).lease_seconds \
        == MAX_LEASE_SECONDS
    with pytest.raises(ConfigError, match="TUNECACHE_LEASE_SECONDS"):
        Settings.from_env({"TUNECACHE_LEASE_SECONDS": str(MAX_LEASE_SECONDS + 1)})


@pytest.mark.parametrize("value", ["postgresql:/host/db", "postgres:host/db",
                                   "sqlite:/tmp/x.db", "postgresql+psycopg:/h/d"])
def test_a_url_missing_its_two_slashes_is_refused_not_made_a_relative_sqlite_path(value):
    with pytest.raises(ConfigError) as error:
        Settings.from_env({"TUNECACHE_DB": value})
    assert str(error.value) == (
        f"TUNECACHE_DB={value!r} is invalid: expected a URL with two slashes after its "
        "scheme (postgresql://host/db, sqlite:////abs/path.db) or a file path")


def test_an_unknown_tunecache_variable_is_noticed_with_the_nearest_name():
    env = {"TUNECACHE_DBB": "/tmp/x.db", "TUNECACHE_LEASE_SECOND": "30",
           "TUNECACHE_NOTHING_LIKE_IT": "1", "TUNECACHE_SHARES": "-kernels", "OTHER": "1"}
    assert list(Settings.from_env(env).notices) == [
        "tunecache: TUNECACHE_DBB is not a tunecache setting and is ignored "
        "(did you mean TUNECACHE_DB?)",
        "tunecache: TUNECACHE_LEASE_SECOND is not a tunecache setting and is ignored "
        "(did you mean TUNECACHE_LEASE_SECONDS?)",
        "tunecache: TUNECACHE_NOTHING_LIKE_IT is not a tunecache setting and is ignored",
        "tunecache: TUNECACHE_SHARES is not a tunecache setting and is ignored "
        "(did you mean TUNECACHE_SHARE?)",
    ]


def test_notices_are_said_once_per_process(caplog, monkeypatch):
    from tunecache.process import PROCESS

    monkeypatch.setattr(PROCESS, "explained", set())
    settings = Settings.from_env({"TUNECACHE_DBB": "/x", "TUNECACHE_KERNELS": "0"})
    with caplog.at_level("WARNING", logger="tunecache"):
        PROCESS.say_notices(settings)
        PROCESS.say_notices(Settings.from_env({"TUNECACHE_DBB": "/x",
                                               "TUNECACHE_KERNELS": "0"}))
    assert [r.getMessage() for r in caplog.records] == list(settings.notices)
