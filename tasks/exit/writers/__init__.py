"""Who wrote what on an install node between the before_install and after_uninstall snapshots."""
