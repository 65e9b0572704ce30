"""The command-line plumbing ieconv and ierun share (click + rich); no format or runtime logic."""
