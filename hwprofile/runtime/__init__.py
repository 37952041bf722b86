"""Runtime: the files, locks and processes hwprofile owns on the host (atomic writes, owned
directories). Everything here has side effects; the layers above call it, never the reverse."""
