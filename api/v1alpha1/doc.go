// Package v1alpha1 will hold the RateLimitPolicy API type
// (ratelimit.slidegate.dev/v1alpha1); it comes with issue 4.
package v1alpha1
