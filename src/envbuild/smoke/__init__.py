"""The smoke test: `inside` runs in the image (stdlib + torch + numpy), `host` drives it."""
