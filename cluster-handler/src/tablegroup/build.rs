//! The Shards of a TableGroup, one per resolved shard entry: pure, no client.

use multigres_api::labels::{Component, Placement};
use multigres_api::names;
use multigres_api::owner::{Owner, OwnerError};
use multigres_api::resolver::shard_spec;
use multigres_api::v1alpha1::{Shard, TableGroup, TableGroupSpec};

/// `tg` as the owner of its Shards, which block its foreground deletion until they are gone.
pub fn owner(tg: &TableGroup) -> Result<Owner, OwnerError> {
    Owner::of(tg).map(Owner::blocking_deletion)
}

/// One Shard per entry of `spec.shards`.
pub fn shards(owner: &Owner, spec: &TableGroupSpec) -> Vec<Shard> {
    let (database, table_group) = (spec.database_name.as_str(), spec.table_group_name.as_str());
    spec.shards
        .iter()
        .map(|entry| {
            let at = Placement {
                database: Some(database),
                table_group: Some(table_group),
                shard: Some(&entry.name),
                ..Placement::default()
            };
            let name = names::shard(&owner.cluster, database, table_group, &entry.name);
            Shard {
                metadata: crate::cluster::build::metadata(owner, name, Component::Shard, &at),
                spec: shard_spec(spec, entry),
                status: None,
            }
        })
        .collect()
}
