// Guards against the silent-pass trap: an exported RUSTFLAGS overrides the
// `cargo sim` alias's `build.rustflags`, the crate then builds without
// `--cfg madsim`, and every `#![cfg(madsim)]` test compiles to nothing. The
// alias sets STEAD_SIM_ALIAS; if it is set but madsim is not, fail the build.
fn main() {
    println!("cargo:rerun-if-env-changed=STEAD_SIM_ALIAS");
    println!("cargo:rerun-if-env-changed=RUSTFLAGS");
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    let alias = std::env::var_os("STEAD_SIM_ALIAS").is_some();
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let madsim = flags
        .split('\x1f')
        .collect::<Vec<_>>()
        .windows(2)
        .any(|w| w[0] == "--cfg" && w[1] == "madsim")
        || flags.split('\x1f').any(|f| f == "--cfg=madsim");
    if alias && !madsim {
        panic!(
            "stead-sim is being built by `cargo sim` without `--cfg madsim` \
             (an exported RUSTFLAGS overrides build.rustflags). \
             Use RUSTFLAGS=\"$RUSTFLAGS --cfg madsim\" or unset RUSTFLAGS."
        );
    }
}
