//! cluster-handler: turns a MultigresCluster (and its templates) into child custom resources
//! (TopoServer, Cell, TableGroup, Shard) and aggregates their status.

use cluster_handler::cluster::images::{ImageDefaults, parse_image, parse_strategy};
use multigres_api::resolver::defaults;
use multigres_api::v1alpha1::{ComponentImages, ImageRef, ImageUpdateStrategy};
use multigres_common::cli::HandlerSpec;

const SPEC: HandlerSpec = HandlerSpec {
    name: cluster_handler::NAME,
    version: env!("CARGO_PKG_VERSION"),
    about: env!("CARGO_PKG_DESCRIPTION"),
    grpc_bind_address: ":9441",
    metrics_bind_address: ":8081",
    leader_election_id: "multigres-operator-cluster-handler",
};

/// The operator's default image set (components a cluster does not set in `spec.images`) and
/// when clusters adopt a changed one.
#[derive(Debug, clap::Args)]
struct ImageArgs {
    /// Default image of pgctld (PostgreSQL and pgBackRest).
    #[arg(long, env = "MULTIGRES_IMAGE_POSTGRES", default_value = defaults::POSTGRES_IMAGE, value_parser = parse_image)]
    image_postgres: ImageRef,
    /// Default image of multigateway.
    #[arg(long, env = "MULTIGRES_IMAGE_MULTIGATEWAY", default_value = defaults::MULTIGRES_IMAGE, value_parser = parse_image)]
    image_multigateway: ImageRef,
    /// Default image of multiorch.
    #[arg(long, env = "MULTIGRES_IMAGE_MULTIORCH", default_value = defaults::MULTIGRES_IMAGE, value_parser = parse_image)]
    image_multiorch: ImageRef,
    /// Default image of multipooler.
    #[arg(long, env = "MULTIGRES_IMAGE_MULTIPOOLER", default_value = defaults::MULTIGRES_IMAGE, value_parser = parse_image)]
    image_multipooler: ImageRef,
    /// Default image of multiadmin.
    #[arg(long, env = "MULTIGRES_IMAGE_MULTIADMIN", default_value = defaults::MULTIGRES_IMAGE, value_parser = parse_image)]
    image_multiadmin: ImageRef,
    /// Default image of the multiadmin web UI.
    #[arg(long, env = "MULTIGRES_IMAGE_MULTIADMIN_WEB", default_value = defaults::MULTIADMIN_WEB_IMAGE, value_parser = parse_image)]
    image_multiadmin_web: ImageRef,
    /// When clusters that set no `spec.imageUpdatePolicy.strategy` adopt a changed default
    /// set: `immediate` (next reconcile) or `lazy` (once `acknowledgedRevision` names it).
    #[arg(long, env = "MULTIGRES_IMAGE_UPDATE_STRATEGY", default_value = "immediate", value_parser = parse_strategy)]
    image_update_strategy: ImageUpdateStrategy,
}

impl ImageArgs {
    fn defaults(self) -> ImageDefaults {
        ImageDefaults {
            images: ComponentImages {
                multigateway: Some(self.image_multigateway),
                multiorch: Some(self.image_multiorch),
                multipooler: Some(self.image_multipooler),
                multiadmin: Some(self.image_multiadmin),
                multiadmin_web: Some(self.image_multiadmin_web),
                postgres: Some(self.image_postgres),
            },
            strategy: self.image_update_strategy,
        }
    }
}

fn main() -> anyhow::Result<()> {
    multigres_common::controller_main(SPEC, |ctx, scope, images: ImageArgs| {
        let images = images.defaults();
        tracing::info!(
            revision = %multigres_api::resolver::images::revision(&images.images),
            strategy = ?images.strategy,
            "default image set"
        );
        cluster_handler::run(ctx, scope, images)
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use multigres_common::cli::{self, ControllerArgs};

    use super::*;

    type Cli = ControllerArgs<ImageArgs>;

    #[test]
    fn flags_parse_with_this_binary_defaults() {
        let cli: Cli = cli::try_parse_from(&SPEC, ["cluster-handler"]).unwrap();
        assert_eq!(cli.common.grpc_bind_address.port(), 9441);
        assert_eq!(cli.common.metrics_bind_address.addr().unwrap().port(), 8081);
        assert_eq!(
            cli.leader.leader_election_id,
            "multigres-operator-cluster-handler"
        );
    }

    #[test]
    fn default_images_come_from_flags_with_compiled_fallbacks() {
        let cli: Cli = cli::try_parse_from(&SPEC, ["cluster-handler"]).unwrap();
        assert_eq!(cli.own.defaults(), ImageDefaults::default());
        let cli: Cli = cli::try_parse_from(
            &SPEC,
            [
                "cluster-handler",
                "--image-postgres=registry/pgctld:2",
                "--image-update-strategy=lazy",
            ],
        )
        .unwrap();
        let images = cli.own.defaults();
        assert_eq!(images.strategy, ImageUpdateStrategy::Lazy);
        assert_eq!(
            images.images.postgres.unwrap().as_str(),
            "registry/pgctld:2"
        );
        assert_eq!(
            images.images.multiorch.unwrap().as_str(),
            defaults::MULTIGRES_IMAGE
        );
        assert!(
            cli::try_parse_from::<Cli, _, _>(
                &SPEC,
                ["cluster-handler", "--image-update-strategy=soon"]
            )
            .is_err()
        );
        assert!(
            cli::try_parse_from::<Cli, _, _>(&SPEC, ["cluster-handler", "--image-multiorch="])
                .is_err()
        );
    }
}
