"""app.cache.access_api against a real kube-apiserver: real ServiceAccount tokens (TokenRequest), real RBAC
on the non-resource URL /map, a TokenReview and a SubjectAccessReview as topoguard sends them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from app.cache.access import Access
from app.cache.access_api import ApiAccessReviewer
from tests.e2e import kube

NAMESPACE = "topoguard-map-e2e"
READER_ROLE = "e2e-topoguard-map-reader"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def service_account_token(handle: kube.Cluster, name: str) -> str:
    handle.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                   {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    answer, _ = handle.request(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}},
    )
    token: str = answer["status"]["token"]
    return token


@pytest.fixture(scope="module")
def tokens(api_client: client.ApiClient) -> Iterator[dict[str, str]]:
    """`reader` may get /map (a ClusterRole bound to it), `other` may not."""
    handle = kube.Cluster(api_client, {})
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": READER_ROLE},
         "rules": [{"nonResourceURLs": ["/map"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": READER_ROLE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER_ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": NAMESPACE}]},
    ]
    paths = ["/api/v1/namespaces", f"{RBAC}/clusterroles", f"{RBAC}/clusterrolebindings"]
    for path, obj in zip(paths, objects, strict=True):
        handle.request("POST", path, obj)
    try:
        yield {name: service_account_token(handle, name) for name in ("reader", "other")}
    finally:
        for path, obj in reversed(list(zip(paths, objects, strict=True))):
            handle.request("DELETE", f"{path}/{obj['metadata']['name']}")


def test_a_bound_service_account_may_get_the_map(api_client: client.ApiClient, tokens: dict[str, str]) -> None:
    got = ApiAccessReviewer(api_client).review(tokens["reader"], verb="get", path="/map")
    assert got == Access("allowed", user=f"system:serviceaccount:{NAMESPACE}:reader")


@pytest.mark.parametrize("who, verb", [("reader", "post"), ("other", "get")],
                         ids=["a verb the role does not grant is denied", "an account without the role is denied"])
def test_what_rbac_does_not_grant_is_denied(api_client: client.ApiClient, tokens: dict[str, str],
                                            who: str, verb: str) -> None:
    got = ApiAccessReviewer(api_client).review(tokens[who], verb=verb, path="/map")
    assert (got.verdict, got.user) == ("denied", f"system:serviceaccount:{NAMESPACE}:{who}")


def test_a_made_up_token_is_unauthenticated(api_client: client.ApiClient) -> None:
    assert ApiAccessReviewer(api_client).review("not-a-token", verb="get", path="/map").verdict == "unauthenticated"


def test_a_reviewer_without_auth_delegation_is_an_error_not_access(
    api_client: client.ApiClient, tokens: dict[str, str]
) -> None:
    """topoguard's own account without system:auth-delegator: the TokenReview is forbidden (an error)."""
    configuration = client.Configuration()
    configuration.host = api_client.configuration.host
    configuration.ssl_ca_cert = api_client.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {tokens['other']}"}
    with client.ApiClient(configuration) as unprivileged:
        got = ApiAccessReviewer(unprivileged).review(tokens["reader"], verb="get", path="/map")
    assert got.verdict == "error" and "TokenReview failed: HTTP 403" in got.reason
