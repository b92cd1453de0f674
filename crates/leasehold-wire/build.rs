//! Compiles `proto/` with a vendored `protoc`, so a fresh machine needs no system protobuf.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("leasehold_descriptor.bin"))
        .compile_with_config(
            config,
            &["../../proto/leasehold/v1/leasehold.proto"],
            &["../../proto"],
        )?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
