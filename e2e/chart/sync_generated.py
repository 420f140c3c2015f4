"""Regenerate the chart's generated files: the CRD copies in charts/quiver-operator/crds/ (from
the operator's crdgen output in crds/) and the plain alert rules file (from the chart's
PrometheusRule template). The chart tests fail until this has been run after a change."""

from chartlib import RULES_FILE, sync_crds, write_rules_file


def main() -> None:
    copied = sync_crds()
    print(f"chart crds/: {', '.join(copied) if copied else 'no CRDs in crds/ yet'}")
    write_rules_file()
    print(f"wrote {RULES_FILE}")


if __name__ == "__main__":
    main()
