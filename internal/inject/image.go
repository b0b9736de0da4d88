package inject

import (
	"errors"
	"fmt"
	"strings"
)

// ReleaseImage is the release image of slidegate release v (make image's
// tag): ImageRepository:v.
func ReleaseImage(v string) string {
	if v == "" {
		v = "devel"
	}
	return ImageRepository + ":" + v
}

// ImageRepositoryOf is the repository of image reference ref: without its
// digest and tag ("ghcr.io/slidegate/slidegate" of
// "ghcr.io/slidegate/slidegate:v0.2.0@sha256:..."). A ':' before the last
// '/' is a registry's port, not a tag.
func ImageRepositoryOf(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	slash := strings.LastIndex(ref, "/")
	if i := strings.LastIndex(ref, ":"); i > slash {
		ref = ref[:i]
	}
	return ref
}

// CheckImage refuses a sidecar image that may change under its name: one
// without a tag or digest, or tagged latest. With IfNotPresent, a moving
// tag lets each node run whichever sidecar it pulled first, so one
// policy's pods would enforce with different releases.
func CheckImage(image string) error {
	rest, digest, pinned := strings.Cut(image, "@")
	if pinned {
		hexDigits := strings.TrimPrefix(digest, "sha256:")
		if len(hexDigits) != 64 || len(digest) == len(hexDigits) || strings.Trim(hexDigits, "0123456789abcdef") != "" {
			return fmt.Errorf("sidecar image %q: the digest is not sha256:<64 hex digits>", image)
		}
		return nil
	}
	// The tag follows the last ':' after the last '/' (a ':' before it
	// is a registry's port).
	last := rest[strings.LastIndex(rest, "/")+1:]
	_, tag, tagged := strings.Cut(last, ":")
	switch {
	case rest == "":
		return errors.New("sidecar image: empty")
	case !tagged || tag == "":
		return fmt.Errorf("sidecar image %q: no tag; give a release tag (and its digest), not the implied latest", image)
	case tag == "latest":
		return fmt.Errorf("sidecar image %q: latest moves; give a release tag (and its digest)", image)
	}
	return nil
}
