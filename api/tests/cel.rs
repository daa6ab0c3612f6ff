//! CEL rules evaluated locally (kube's `cel` feature) against the generated schemas: what each
//! rule accepts as well as what it refuses. The refusals of every rule are also covered, one
//! manifest per rule, by `e2e/fixtures/invalid/` (see `fixtures.rs`).

mod common;

use common::cel_errors;
use serde_json::{Value, json};

fn cluster(spec: Value) -> Value {
    cluster_named("demo", spec)
}

fn cluster_named(name: &str, spec: Value) -> Value {
    let mut full = json!({
        "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
        "cells": [{"name": "zone-a", "zoneId": "zone-a"}]
    });
    full.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    json!({
        "apiVersion": "multigres.com/v1alpha1",
        "kind": "MultigresCluster",
        "metadata": {"name": name},
        "spec": full
    })
}

fn object(kind: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "multigres.com/v1alpha1",
        "kind": kind,
        "metadata": {"name": "demo"},
        "spec": spec
    })
}

fn with_shard(shard: Value) -> Value {
    json!({"databases": [{"name": "postgres", "default": true, "tablegroups": [
        {"name": "default", "default": true, "shards": [shard]}
    ]}]})
}

#[track_caller]
fn accepted(obj: &Value) {
    let errors = cel_errors(obj, None);
    assert!(errors.is_empty(), "refused: {errors:?}");
}

#[track_caller]
fn refused(obj: &Value, message: &str) {
    let errors = cel_errors(obj, None);
    assert!(
        errors.iter().any(|e| e.contains(message)),
        "expected `{message}`, got {errors:?}"
    );
}

#[track_caller]
fn update_accepted(old: &Value, new: &Value) {
    assert!(cel_errors(old, None).is_empty(), "original refused");
    let errors = cel_errors(new, Some(old));
    assert!(errors.is_empty(), "update refused: {errors:?}");
}

#[track_caller]
fn update_refused(old: &Value, new: &Value, message: &str) {
    assert!(cel_errors(old, None).is_empty(), "original refused");
    let errors = cel_errors(new, Some(old));
    assert!(
        errors.iter().any(|e| e.contains(message)),
        "expected `{message}`, got {errors:?}"
    );
}

#[test]
fn cluster_name_is_at_most_25_characters() {
    accepted(&cluster_named(&"a".repeat(25), json!({})));
    refused(
        &cluster_named(&"a".repeat(26), json!({})),
        "MultigresCluster name must be at most 25 characters",
    );
}

#[test]
fn global_topo_server_is_exactly_one_source() {
    for source in [
        json!({"etcd": {"replicas": 3}}),
        json!({"external": {"endpoints": ["https://etcd:2379"]}}),
        json!({"templateRef": "core"}),
    ] {
        accepted(&cluster(json!({"globalTopoServer": source})));
    }
    let message = "must specify exactly one of 'etcd', 'external', or 'templateRef'";
    refused(&cluster(json!({"globalTopoServer": {}})), message);
    refused(
        &cluster(json!({"globalTopoServer": {"etcd": {}, "templateRef": "core"}})),
        message,
    );
}

#[test]
fn etcd_replicas_are_odd() {
    for replicas in [1, 3, 5, 7] {
        accepted(&cluster(
            json!({"globalTopoServer": {"etcd": {"replicas": replicas}}}),
        ));
    }
    for replicas in [2, 4] {
        refused(
            &cluster(json!({"globalTopoServer": {"etcd": {"replicas": replicas}}})),
            "etcd replicas must be an odd number",
        );
    }
}

#[test]
fn multiadmin_takes_spec_or_template_not_both() {
    for key in ["multiadmin", "multiadminWeb"] {
        accepted(&cluster(json!({key: {"spec": {"replicas": 1}}})));
        accepted(&cluster(json!({key: {"templateRef": "core"}})));
        refused(
            &cluster(json!({key: {"spec": {}, "templateRef": "core"}})),
            "cannot specify both 'spec' and 'templateRef'",
        );
        refused(
            &cluster(json!({key: {}})),
            "must specify either 'spec' or 'templateRef'",
        );
    }
}

#[test]
fn cells_need_exactly_one_of_zone_and_region() {
    accepted(&cluster(json!({"cells": [{"name": "a", "region": "r1"}]})));
    accepted(&cluster(json!({"cells": [
        {"name": "a", "zoneId": "z1", "cellTemplate": "t", "overrides": {"multigateway": {"replicas": 2}}}
    ]})));
    accepted(&cluster(
        json!({"cells": [{"name": "a", "zone": "us-east-1a"}]}),
    ));
    for both in [
        json!({"zone": "us-east-1a", "zoneId": "z1"}),
        json!({"zone": "us-east-1a", "region": "r1"}),
        json!({"zone": "us-east-1a", "zoneId": "z1", "region": "r1"}),
    ] {
        let mut cell = json!({"name": "a"});
        cell.as_object_mut()
            .unwrap()
            .extend(both.as_object().unwrap().clone());
        refused(
            &cluster(json!({ "cells": [cell] })),
            "cannot specify more than one of 'zone', 'zoneId' and 'region'",
        );
    }
    refused(
        &cluster(json!({"cells": [{"name": "a", "zoneId": "z1", "region": "r1"}]})),
        "cannot specify more than one of 'zone', 'zoneId' and 'region'",
    );
    refused(
        &cluster(json!({"cells": [{"name": "a"}]})),
        "at least one of 'zone', 'zoneId' or 'region' must be specified",
    );
}

#[test]
fn cells_are_append_only_and_keep_their_location() {
    let one = cluster(json!({"cells": [{"name": "a", "zoneId": "z1"}]}));
    let two =
        cluster(json!({"cells": [{"name": "a", "zoneId": "z1"}, {"name": "b", "region": "r1"}]}));
    // Reordering cells is also accepted by the API server, which correlates list-map items by
    // key; kube-cel correlates them by index, so that case is left to the e2e tests.
    update_accepted(&one, &two);
    update_accepted(&one, &one);
    update_refused(
        &two,
        &one,
        "Cells cannot be removed or renamed (Append-Only)",
    );
    let moved = cluster(json!({"cells": [{"name": "a", "zoneId": "z2"}]}));
    update_refused(&one, &moved, "zoneId is immutable");
    let to_region = cluster(json!({"cells": [{"name": "a", "region": "r1"}]}));
    update_refused(&one, &to_region, "zoneId is immutable");
    update_refused(&one, &to_region, "region is immutable");
    let in_zone = cluster(json!({"cells": [{"name": "a", "zone": "us-east-1a"}]}));
    update_refused(&one, &in_zone, "zone is immutable");
    update_refused(&one, &in_zone, "zoneId is immutable");
    let zone_moved = cluster(json!({"cells": [{"name": "a", "zone": "us-east-1b"}]}));
    update_refused(&in_zone, &zone_moved, "zone is immutable");
    update_accepted(&in_zone, &in_zone);
}

#[test]
fn only_the_postgres_database_with_one_default_tablegroup() {
    accepted(&cluster(
        json!({"databases": [{"name": "postgres", "default": true}]}),
    ));
    accepted(&cluster(
        json!({"databases": [{"name": "postgres", "default": true, "tablegroups": [
            {"name": "default", "default": true}, {"name": "orders"}
        ]}]}),
    ));
    let only_postgres = "only the single system database named 'postgres'";
    refused(
        &cluster(json!({"databases": [{"name": "postgres", "default": false}]})),
        only_postgres,
    );
    refused(
        &cluster(json!({"databases": [{"name": "app", "default": true}]})),
        only_postgres,
    );
    refused(
        &cluster(
            json!({"databases": [{"name": "postgres", "default": true, "tablegroups": [
                {"name": "default", "default": true}, {"name": "other", "default": true}
            ]}]}),
        ),
        "every database must have exactly one tablegroup marked as default",
    );
    refused(
        &cluster(
            json!({"databases": [{"name": "postgres", "default": true, "tablegroups": [
                {"name": "main", "default": true}
            ]}]}),
        ),
        "the default tablegroup must be named 'default'",
    );
}

#[test]
fn shards_are_named_0_inf_and_inline_or_templated() {
    accepted(&cluster(with_shard(json!({"name": "0-inf"}))));
    accepted(&cluster(with_shard(
        json!({"name": "0-inf", "shardTemplate": "t", "overrides": {"initdbArgs": "-k"}}),
    )));
    refused(
        &cluster(with_shard(json!({"name": "0-80"}))),
        "shardName must be strictly equal to '0-inf' in this version",
    );
    refused(
        &cluster(with_shard(
            json!({"name": "0-inf", "shardTemplate": "t", "spec": {}}),
        )),
        "cannot specify both 'spec' and 'shardTemplate'",
    );
}

#[test]
fn pool_names_are_short_dns_labels() {
    let pools = |name: &str| {
        cluster(with_shard(
            json!({"name": "0-inf", "spec": {"pools": {name: {}}}}),
        ))
    };
    accepted(&pools(&"p".repeat(25)));
    accepted(&pools("main-2"));
    refused(&pools(&"p".repeat(26)), "pool names must be <= 25 chars");
    for bad in ["Main", "main_pool", "-main", "main-"] {
        refused(&pools(bad), "pool names must consist of lowercase letters");
    }
    let template = |name: &str| object("ShardTemplate", json!({"pools": {name: {}}}));
    accepted(&template("main"));
    refused(&template(&"p".repeat(26)), "pool names must be <= 25 chars");
    refused(
        &template("Main"),
        "pool names must consist of lowercase letters",
    );
}

#[test]
fn pools_and_pool_cells_are_append_only() {
    let shard = |pools: Value| {
        cluster(with_shard(
            json!({"name": "0-inf", "spec": {"pools": pools}}),
        ))
    };
    let one = shard(json!({"main": {"cells": ["zone-a"]}}));
    let grown = shard(json!({"main": {"cells": ["zone-a", "zone-b"]}, "extra": {}}));
    update_accepted(&one, &grown);
    update_refused(
        &grown,
        &one,
        "Pools cannot be removed or renamed in this version (Append-Only)",
    );
    let shrunk = shard(json!({"main": {"cells": ["zone-b"]}, "extra": {}}));
    update_refused(
        &grown,
        &shrunk,
        "Cells cannot be removed from a pool (Append-Only)",
    );
}

#[test]
fn backup_blocks_match_their_type_and_encryption_is_fixed() {
    let backup = |b: Value| cluster(json!({"backup": b}));
    accepted(&backup(json!({"type": "filesystem", "filesystem": {}})));
    accepted(&backup(
        json!({"type": "s3", "s3": {"bucket": "b", "region": "r"}}),
    ));
    refused(
        &backup(json!({"type": "s3"})),
        "s3 config is required when type is 's3'",
    );
    refused(
        &backup(json!({"type": "filesystem"})),
        "filesystem config is required when type is 'filesystem'",
    );
    let plain = backup(json!({"type": "filesystem", "filesystem": {}}));
    let encrypted =
        backup(json!({"type": "filesystem", "filesystem": {}, "encryption": {"secretName": "k1"}}));
    let rotated =
        backup(json!({"type": "filesystem", "filesystem": {}, "encryption": {"secretName": "k2"}}));
    let moved = backup(
        json!({"type": "filesystem", "filesystem": {"path": "/b"}, "encryption": {"secretName": "k1"}}),
    );
    let message = "encryption is immutable";
    update_accepted(&encrypted, &moved);
    update_refused(&encrypted, &rotated, message);
    update_refused(&encrypted, &plain, message);
    update_refused(&plain, &encrypted, message);
}

#[test]
fn s3_credentials_come_from_one_source() {
    let s3 = |extra: Value| {
        let mut s3 = json!({"bucket": "b", "region": "r"});
        s3.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        cluster(json!({"backup": {"type": "s3", "s3": s3}}))
    };
    accepted(&s3(json!({"serviceAccountName": "irsa"})));
    accepted(&s3(
        json!({"credentialsSecret": "creds", "useEnvCredentials": true}),
    ));
    accepted(&s3(
        json!({"serviceAccountName": "", "credentialsSecret": "creds"}),
    ));
    refused(
        &s3(json!({"serviceAccountName": "irsa", "credentialsSecret": "creds"})),
        "serviceAccountName and credentialsSecret are mutually exclusive",
    );
    refused(
        &s3(json!({"serviceAccountName": "irsa", "useEnvCredentials": true})),
        "serviceAccountName and useEnvCredentials are mutually exclusive",
    );
}

#[test]
fn external_services_and_pods_keep_metadata_in_bounds() {
    for key in ["externalGateway", "externalAdminWeb"] {
        accepted(&cluster(
            json!({key: {"enabled": true, "annotations": {"example.com/a": "b"}}}),
        ));
        refused(
            &cluster(json!({key: {"enabled": true, "annotations": {"multigres.com/a": "b"}}})),
            "annotations must not use multigres.com/ prefix",
        );
    }
    let admin = |spec: Value| cluster(json!({"multiadmin": {"spec": spec}}));
    accepted(&admin(
        json!({"podAnnotations": {"k".repeat(63): "v".repeat(255)}}),
    ));
    refused(
        &admin(json!({"podAnnotations": {"k": "v".repeat(256)}})),
        "annotation keys must be <64 chars and values <256 chars",
    );
    accepted(&admin(
        json!({"podLabels": {"k".repeat(63): "v".repeat(63)}}),
    ));
    refused(
        &admin(json!({"podLabels": {"k".repeat(64): "v"}})),
        "label keys and values must be <64 chars",
    );
}

#[test]
fn topology_servers_are_etcd_or_external() {
    let local = |topo: Value| {
        cluster(json!({"cells": [{"name": "a", "zoneId": "z", "spec": {"localTopoServer": topo}}]}))
    };
    accepted(&local(json!({"etcd": {}})));
    accepted(&local(
        json!({"external": {"endpoints": ["http://etcd:2379"]}}),
    ));
    refused(
        &local(json!({})),
        "must specify either 'etcd' or 'external'",
    );
    refused(
        &local(json!({"etcd": {}, "external": {"endpoints": ["http://etcd:2379"]}})),
        "only one of 'etcd' or 'external' can be set",
    );
    refused(
        &local(json!({"external": {"endpoints": ["http://etcd:2379", "etcd:2379"]}})),
        "endpoints must be valid URLs",
    );
    accepted(&object(
        "CoreTemplate",
        json!({"globalTopoServer": {"etcd": {"replicas": 3}}}),
    ));
    refused(
        &object("CoreTemplate", json!({"globalTopoServer": {}})),
        "must specify 'etcd' configuration",
    );
    accepted(&object("TopoServer", json!({"etcd": {"replicas": 3}})));
    refused(
        &object("TopoServer", json!({})),
        "must specify 'etcd' configuration",
    );
}

fn child_shard(pools: Value) -> Value {
    object(
        "Shard",
        json!({
            "databaseName": "postgres",
            "tableGroupName": "default",
            "shardName": "0-inf",
            "images": {"multiorch": "m", "multipooler": "p", "postgres": "pg"},
            "globalTopoServer": {"address": "topo:2379", "rootPath": "/multigres/global", "implementation": "etcd"},
            "multiorch": {},
            "pools": pools,
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"}
        }),
    )
}

#[test]
fn child_kinds_keep_upstream_rules() {
    accepted(&child_shard(json!({"p".repeat(62): {}})));
    refused(
        &child_shard(json!({"p".repeat(63): {}})),
        "pool names must be < 63 chars",
    );
    update_refused(
        &child_shard(json!({"main": {"cells": ["a", "b"]}})),
        &child_shard(json!({"main": {"cells": ["a"]}})),
        "Cells cannot be removed from a pool (Append-Only)",
    );
    let cell = |location: Value| {
        let mut spec = json!({
            "name": "zone-a",
            "images": {"multigateway": "g"},
            "multigateway": {},
            "globalTopoServer": {"address": "topo:2379", "rootPath": "/multigres/global", "implementation": "etcd"}
        });
        spec.as_object_mut()
            .unwrap()
            .extend(location.as_object().unwrap().clone());
        object("Cell", spec)
    };
    accepted(&cell(json!({"zoneId": "z"})));
    accepted(&cell(json!({"zone": "z"})));
    refused(
        &cell(json!({"zone": "z", "region": "r"})),
        "cannot specify more than one of 'zone', 'zoneId' and 'region'",
    );
    refused(
        &cell(json!({"zoneId": "z", "region": "r"})),
        "cannot specify more than one of 'zone', 'zoneId' and 'region'",
    );
    refused(
        &cell(json!({})),
        "at least one of 'zone', 'zoneId' or 'region' must be specified",
    );
}

#[test]
fn templates_without_a_spec_are_accepted() {
    for kind in ["CoreTemplate", "CellTemplate", "ShardTemplate"] {
        accepted(&json!({
            "apiVersion": "multigres.com/v1alpha1",
            "kind": kind,
            "metadata": {"name": "empty"},
        }));
        let schema = common::schema_of(kind);
        assert!(
            !schema["required"]
                .as_array()
                .is_some_and(|r| r.contains(&json!("spec"))),
            "{kind} requires spec"
        );
        assert_eq!(schema["properties"]["spec"]["default"], json!({}), "{kind}");
    }
}

#[test]
fn the_gateway_certificate_has_one_source_and_needs_tls() {
    accepted(&cluster(json!({"issuerName": "corp-ca"})));
    accepted(&cluster(
        json!({"gatewayTLS": {"secretName": "db-gateway-tls", "required": true}}),
    ));
    accepted(&cluster(
        json!({"issuerName": "corp-ca", "gatewayTLS": {"required": true}}),
    ));
    refused(
        &cluster(json!({"issuerName": "corp-ca", "gatewayTLS": {"secretName": "mine"}})),
        "spec.issuerName and spec.gatewayTLS.secretName both name a source",
    );
    refused(
        &cluster(json!({"issuerName": "corp-ca", "gatewayTLS": {"enabled": false}})),
        "spec.issuerName: a gateway certificate needs gateway TLS",
    );
    refused(
        &cluster(json!({"gatewayTLS": {"enabled": false, "secretName": "mine"}})),
        "spec.gatewayTLS.secretName: a gateway certificate needs TLS enabled",
    );
}

#[test]
fn declared_roles_keep_clear_of_the_superuser_and_the_application_role() {
    accepted(&cluster(json!({"roles": [
        {"name": "reporting", "inRoles": ["pg_read_all_data"], "validUntil": "2027-01-01T00:00:00Z"},
        {"name": "old_batch", "ensure": "absent"}
    ]})));
    accepted(&cluster(json!({
        "applicationRole": {"enabled": false},
        "roles": [{"name": "app"}]
    })));
    accepted(&cluster(json!({
        "applicationRole": {"name": "shop"},
        "roles": [{"name": "app"}]
    })));
    accepted(&cluster(json!({
        "postgresSuperuser": "admin",
        "roles": [{"name": "postgres"}]
    })));
    refused(
        &cluster(json!({"postgresSuperuser": "admin", "roles": [{"name": "admin"}]})),
        "spec.roles: the superuser is the operator's",
    );
    refused(
        &cluster(json!({"applicationRole": {"name": "shop"}, "roles": [{"name": "shop"}]})),
        "spec.roles: a declared role takes the application role's name",
    );
    refused(
        &cluster(json!({"roles": [{"name": "multiadmin_web"}]})),
        "multiadmin_web is the operator's",
    );
    refused(
        &cluster(json!({"applicationRole": {"name": "multiadmin_web"}})),
        "spec.applicationRole.name: names starting with pg_",
    );
}

#[test]
fn a_filesystem_backup_path_is_a_directory_of_its_own() {
    let backup = |path: &str| {
        cluster(json!({"backup": {"type": "filesystem", "filesystem": {"path": path}}}))
    };
    for good in [
        "/backups",
        "/mnt/backups",
        "/var/backups",
        "/data/pg.backups",
    ] {
        accepted(&backup(good));
    }
    for (bad, message) in [
        ("backups", "must be an absolute directory other than /"),
        ("/", "must be an absolute directory other than /"),
        ("/backups/", "must be normalized"),
        ("/a//b", "must be normalized"),
        ("/backups/../var/lib/pooler", "must be normalized"),
        (
            "/var/lib/pooler/pg_data",
            "must not be, lie inside or contain",
        ),
        ("/var/lib", "must not be, lie inside or contain"),
        (
            "/etc/postgres-password",
            "must not be, lie inside or contain",
        ),
        ("/tmp", "must not be, lie inside or contain"),
    ] {
        refused(&backup(bad), message);
    }
}

#[test]
fn the_superuser_is_not_a_pg_role() {
    for good in ["postgres", "_admin", "dba2"] {
        accepted(&cluster(json!({"postgresSuperuser": good})));
    }
    refused(
        &cluster(json!({"postgresSuperuser": "pg_admin"})),
        "must not start with pg_",
    );
}
