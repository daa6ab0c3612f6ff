//! CoreTemplate, CellTemplate and ShardTemplate: reusable configuration that clusters reference
//! by name. Templates are read by the resolver and never reconciled on their own.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSON,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{ApiResource, NamespaceResourceScope};
use kube::{CustomResource, CustomResourceExt, KubeSchema, Resource};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize};

use super::{
    cell::MultigatewaySpec,
    common::{InitdbArgs, PodPlacementSpec, PostgresConfigRef, PvcDeletionPolicy, StatelessSpec},
    rules,
    shard::{MultiorchSpec, Pools},
    toposerver::{LocalTopoServerSpec, TopoServerSpec},
};

/// Reusable settings of a cluster's global components.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "multigres.com",
    version = "v1alpha1",
    kind = "CoreTemplate",
    root = "CoreTemplateCrd",
    namespaced,
    shortname = "cot",
    category = "multigres",
    doc = "CoreTemplate holds reusable settings of a MultigresCluster's global components: the global topology server (etcd) and multiadmin. Referenced by name from clusters in the same namespace; the one named 'default' applies when a cluster names none."
)]
#[serde(rename_all = "camelCase")]
pub struct CoreTemplateSpec {
    /// Global topology server; templates can only describe a managed etcd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_topo_server: Option<TopoServerSpec>,

    /// multiadmin settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin: Option<StatelessSpec>,

    /// Scheduling of the multiadmin pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin_placement: Option<PodPlacementSpec>,

    /// multiadmin web UI settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin_web: Option<StatelessSpec>,
}

/// Reusable settings of a cell.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "multigres.com",
    version = "v1alpha1",
    kind = "CellTemplate",
    root = "CellTemplateCrd",
    namespaced,
    shortname = "cet",
    category = "multigres",
    doc = "CellTemplate holds reusable settings of a cell: its multigateway and optional local topology server. Referenced by name from clusters in the same namespace; the one named 'default' applies when a cell names none."
)]
#[serde(rename_all = "camelCase")]
pub struct CellTemplateSpec {
    /// multigateway settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway: Option<MultigatewaySpec>,

    /// Scheduling of the multigateway pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway_placement: Option<PodPlacementSpec>,

    /// A cell-local topology server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_topo_server: Option<LocalTopoServerSpec>,
}

/// Reusable settings of a shard.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "multigres.com",
    version = "v1alpha1",
    kind = "ShardTemplate",
    root = "ShardTemplateCrd",
    namespaced,
    shortname = "sht",
    category = "multigres",
    doc = "ShardTemplate holds reusable settings of a shard: multiorch, PostgreSQL pools, storage and resources. Referenced by name from clusters in the same namespace; the one named 'default' applies when a shard names none."
)]
#[serde(rename_all = "camelCase")]
pub struct ShardTemplateSpec {
    /// multiorch settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiorch: Option<MultiorchSpec>,

    /// Extra initdb arguments (e.g. `--locale-provider=icu --icu-locale=en_US.UTF-8`), used
    /// when a pod initializes a new data directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb_args: Option<InitdbArgs>,

    /// Deprecated ConfigMap of extra postgresql.conf lines; prefer `postgresConfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_config_ref: Option<PostgresConfigRef>,

    /// PostgreSQL parameters (at most 200), rendered over the operator's defaults.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 200))]
    pub postgres_config: BTreeMap<String, String>,

    /// Pools by name, at most 8. Pools cannot be removed or renamed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 8))]
    #[x_kube(validation = rules::pool_name_length())]
    #[x_kube(validation = rules::pool_name_pattern())]
    #[x_kube(validation = rules::pools_append_only())]
    pub pools: Pools,

    /// PVC lifecycle of the pools' volumes for shards using this template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_deletion_policy: Option<PvcDeletionPolicy>,
}

/// The root object of a template kind, written out instead of derived: a template without
/// `spec` is an empty template (the upstream operator accepts one), while kube's derive makes
/// `spec` required both in the schema and when deserializing. The derived `<Kind>Crd` type
/// still generates the CRD, with `spec` made optional (see [`optional_spec`]).
macro_rules! template_root {
    ($root:ident, $spec:ident, $crd:ident) => {
        #[doc = concat!("A ", stringify!($root), " object; `spec` defaults to empty.")]
        #[derive(Clone, Debug, Default, PartialEq, Deserialize)]
        #[serde(rename_all = "camelCase")]
        pub struct $root {
            /// Standard object metadata.
            pub metadata: ObjectMeta,
            /// The template's settings; absent means an empty template.
            #[serde(default)]
            pub spec: $spec,
        }

        impl $root {
            /// A template named `name` with `spec`.
            pub fn new(name: &str, spec: $spec) -> Self {
                Self {
                    metadata: ObjectMeta {
                        name: Some(name.to_owned()),
                        ..ObjectMeta::default()
                    },
                    spec,
                }
            }
        }

        impl Serialize for $root {
            fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
                let mut obj = ser.serialize_struct(stringify!($root), 4)?;
                obj.serialize_field("apiVersion", &<$crd as Resource>::api_version(&()))?;
                obj.serialize_field("kind", &<$crd as Resource>::kind(&()))?;
                obj.serialize_field("metadata", &self.metadata)?;
                obj.serialize_field("spec", &self.spec)?;
                obj.end()
            }
        }

        impl Resource for $root {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(dt: &()) -> Cow<'_, str> {
                <$crd as Resource>::kind(dt)
            }

            fn group(dt: &()) -> Cow<'_, str> {
                <$crd as Resource>::group(dt)
            }

            fn version(dt: &()) -> Cow<'_, str> {
                <$crd as Resource>::version(dt)
            }

            fn api_version(dt: &()) -> Cow<'_, str> {
                <$crd as Resource>::api_version(dt)
            }

            fn plural(dt: &()) -> Cow<'_, str> {
                <$crd as Resource>::plural(dt)
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

        impl CustomResourceExt for $root {
            fn crd() -> CustomResourceDefinition {
                optional_spec(<$crd as CustomResourceExt>::crd(), stringify!($root))
            }

            fn crd_name() -> &'static str {
                <$crd as CustomResourceExt>::crd_name()
            }

            fn api_resource() -> ApiResource {
                <$crd as CustomResourceExt>::api_resource()
            }

            fn shortnames() -> &'static [&'static str] {
                <$crd as CustomResourceExt>::shortnames()
            }
        }
    };
}

template_root!(CoreTemplate, CoreTemplateSpec, CoreTemplateCrd);
template_root!(CellTemplate, CellTemplateSpec, CellTemplateCrd);
template_root!(ShardTemplate, ShardTemplateSpec, ShardTemplateCrd);

/// `crd` with `spec` no longer required and defaulting to `{}`: the API server then stores and
/// returns an empty spec for a template written without one, so every reader sees the same
/// thing. The schema is titled `kind`, not after the derived type.
fn optional_spec(mut crd: CustomResourceDefinition, kind: &str) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        let Some(root) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        if let Some(required) = &mut root.required {
            required.retain(|field| field != "spec");
        }
        root.required = root.required.take().filter(|r| !r.is_empty());
        root.title = Some(kind.to_owned());
        if let Some(spec) = root.properties.as_mut().and_then(|p| p.get_mut("spec")) {
            spec.default = Some(JSON(serde_json::json!({})));
        }
    }
    crd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_without_spec_is_an_empty_template() {
        let core: CoreTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "multigres.com/v1alpha1",
            "kind": "CoreTemplate",
            "metadata": {"name": "default"},
        }))
        .unwrap();
        assert_eq!(
            core,
            CoreTemplate::new("default", CoreTemplateSpec::default())
        );
        let cell: CellTemplate =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "c"}})).unwrap();
        assert_eq!(cell.spec, CellTemplateSpec::default());
        let shard: ShardTemplate =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "s"}})).unwrap();
        assert_eq!(shard.spec, ShardTemplateSpec::default());
    }

    #[test]
    fn templates_serialize_as_kubernetes_objects() {
        let value =
            serde_json::to_value(ShardTemplate::new("s", ShardTemplateSpec::default())).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "apiVersion": "multigres.com/v1alpha1",
                "kind": "ShardTemplate",
                "metadata": {"name": "s"},
                "spec": {},
            })
        );
        assert_eq!(ShardTemplate::plural(&()), "shardtemplates");
        assert_eq!(CellTemplate::crd_name(), "celltemplates.multigres.com");
    }

    #[test]
    fn the_template_crds_make_spec_optional_and_default_it_to_empty() {
        for crd in [
            CoreTemplate::crd(),
            CellTemplate::crd(),
            ShardTemplate::crd(),
        ] {
            let root = crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .unwrap();
            assert!(
                !root.required.iter().flatten().any(|r| r == "spec"),
                "{:?}",
                crd.metadata.name
            );
            let spec = &root.properties.as_ref().unwrap()["spec"];
            assert_eq!(spec.default, Some(JSON(serde_json::json!({}))));
        }
    }
}
