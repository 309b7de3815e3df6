"""TUNECACHE_* variables: parsed and validated in one place, with one-line errors."""

from __future__ import annotations

import pytest

from tunecache import settings
from tunecache.errors import ConfigError
from tunecache.settings import Activation, Settings, activation, resolve_db_url


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


@pytest.mark.parametrize(("value", "parts"), [
    ("1", {"gemm", "triton", "fusion"}),
    ("yes", {"gemm", "triton", "fusion"}),
    ("0", set()),
    ("", set()),
    ("fusion", {"fusion"}),
    (" Fusion, triton ", {"fusion", "triton"}),
])
def test_decisive_is_a_flag_for_every_part_or_a_list_of_parts(value, parts):
    assert Settings.from_env({"TUNECACHE_DECISIVE": value}).decisive == parts
    assert Settings.from_env({}).decisive == {"gemm", "fusion"}
    assert Settings.from_env({}, decisive=True).decisive == {"gemm", "triton", "fusion"}
    assert Settings.from_env({}, decisive={"gemm"}).decisive == {"gemm"}


def test_compile_ahead_is_a_number_of_threads_or_0_for_off():
    assert Settings.from_env({}).compile_ahead == 8
    assert Settings.from_env({"TUNECACHE_COMPILE_AHEAD": "0"}).compile_ahead == 0
    assert Settings.from_env({"TUNECACHE_COMPILE_AHEAD": " 8 "}).compile_ahead == 8
    assert Settings.from_env({}, compile_ahead=2).compile_ahead == 2


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
    ("env", "expected"),
    [
        ({}, Activation(hook=False, count_only=False, triton=False)),
        ({"TUNECACHE_DB": "  "}, Activation(hook=False, count_only=False, triton=False)),
        # Triton configs and fusion benchmarks are shared by default; 0 opts out
        ({"TUNECACHE_DB": "/t.db"},
         Activation(hook=True, count_only=False, triton=True, user_kernels=True)),
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_TRITON_CONFIGS": "0"},
         Activation(hook=True, count_only=False, triton=False, user_kernels=True)),
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_MODE": " OFF "},
         Activation(hook=False, count_only=False, triton=False)),
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_TRITON_CONFIGS": "Yes"},
         Activation(hook=True, count_only=False, triton=True, user_kernels=True)),
        ({"TUNECACHE_INDUCTOR_COUNT_ONLY": "1", "TUNECACHE_TRITON_CONFIGS": "1"},
         Activation(hook=True, count_only=True, triton=False)),
        # the autoload never raises: a bad value is reported when the cache is opened
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_TRITON_CONFIGS": "maybe"},
         Activation(hook=True, count_only=False, triton=False, user_kernels=True)),
        # kernels are shared where graphs are: with a key, unless either switch is off
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_SIGNING_KEY": "/k"},
         Activation(hook=True, count_only=False, triton=True, kernels=True,
                    user_kernels=True)),
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_VERIFY_KEY": "/k.pub"},
         Activation(hook=True, count_only=False, triton=True, kernels=True,
                    user_kernels=True)),
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_SIGNING_KEY": "/k", "TUNECACHE_KERNELS": "0"},
         Activation(hook=True, count_only=False, triton=True, kernels=False,
                    user_kernels=True)),
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_SIGNING_KEY": "/k", "TUNECACHE_GRAPHS": "off"},
         Activation(hook=True, count_only=False, triton=True, kernels=False,
                    user_kernels=True)),
        # users' own Triton kernels are shared by default; 0 opts out
        ({"TUNECACHE_DB": "/t.db", "TUNECACHE_USER_KERNELS": "0"},
         Activation(hook=True, count_only=False, triton=True, user_kernels=False)),
        ({"TUNECACHE_INDUCTOR_COUNT_ONLY": "1"},
         Activation(hook=True, count_only=True, triton=False, user_kernels=False)),
        ({"TUNECACHE_SIGNING_KEY": "/k"}, Activation(hook=False, count_only=False,
                                                     triton=False, kernels=False)),
    ],
)
def test_autoload_activation_is_read_from_the_environment(env, expected):
    assert activation(env) == expected


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


def test_an_unknown_tunecache_variable_is_warned_about_once_with_the_nearest_name(caplog):
    env = {"TUNECACHE_DBB": "/tmp/x.db", "TUNECACHE_LEASE_SECOND": "30",
           "TUNECACHE_NOTHING_LIKE_IT": "1", "TUNECACHE_TEST_PG": "postgresql://h/d",
           "OTHER": "1"}
    settings._warned_unknown.difference_update(env)  # once per process: not yet here
    with caplog.at_level("WARNING", logger="tunecache"):
        Settings.from_env(env)
        Settings.from_env(env)
    assert [r.getMessage() for r in caplog.records] == [
        "tunecache: TUNECACHE_DBB is not a tunecache setting and is ignored "
        "(did you mean TUNECACHE_DB?)",
        "tunecache: TUNECACHE_LEASE_SECOND is not a tunecache setting and is ignored "
        "(did you mean TUNECACHE_LEASE_SECONDS?)",
        "tunecache: TUNECACHE_NOTHING_LIKE_IT is not a tunecache setting and is ignored",
    ]
