//! `docs/ops.md` is generated from the registry; this test keeps it current.
//! Regenerate with `TPU_RS_BLESS=1 cargo test -p tpu-ops --test coverage`.

#[test]
fn ops_table_is_up_to_date() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/ops.md");
    let table = tpu_ops::conformance::coverage_table().expect("registry");
    if std::env::var_os("TPU_RS_BLESS").is_some() {
        std::fs::write(path, &table).expect("write docs/ops.md");
        return;
    }
    let current = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        current == table,
        "docs/ops.md is stale; regenerate it with TPU_RS_BLESS=1 cargo test -p tpu-ops --test coverage"
    );
}
