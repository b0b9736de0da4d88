package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
)

// verified is a JWT setting that verifies tokens with keys from the
// namespace's slidegate-jwks ConfigMap.
func verified() *v1alpha1.JWTVerification {
	return &v1alpha1.JWTVerification{
		Issuer:    "https://auth.example.com/",
		Audiences: []string{"api"},
		JWKS:      &v1alpha1.JWKSSource{ConfigMapKey: "auth.json"},
	}
}

// byClaim makes the policy key on the sub claim, with jwt as given.
func byClaim(jwt *v1alpha1.JWTVerification) func(*v1alpha1.RateLimitPolicySpec) {
	return func(s *v1alpha1.RateLimitPolicySpec) {
		s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub", JWT: jwt}
	}
}

// jwtCases are the CEL and schema rules of key.jwt (issue 23, verified
// tokens), run by TestValidation. New cases go at the end.
var jwtCases = []validationCase{
	{name: "jwt: keys from the ConfigMap", mutate: byClaim(verified())},
	{name: "jwt: keys from the issuer", mutate: byClaim(&v1alpha1.JWTVerification{
		Issuer: "https://auth.example.com/", Audiences: []string{"api", "https://api.example.com"},
		JWKS: &v1alpha1.JWKSSource{URL: "https://auth.example.com:8443/.well-known/jwks.json?v=2"},
	})},
	{name: "jwt: verified upstream", mutate: byClaim(&v1alpha1.JWTVerification{InsecureSkipVerification: v1alpha1.InsecureSkipVerificationVerifiedUpstream})},
	{name: "jwt: JWTClaim without jwt", mutate: byClaim(nil),
		wantErr: []string{"spec.key", "source JWTClaim needs jwt: the issuer, audiences and jwks to verify tokens with, or insecureSkipVerification: VerifiedUpstream"}},
	{name: "jwt: on a header key", mutate: func(s *v1alpha1.RateLimitPolicySpec) { s.Key.JWT = verified() },
		wantErr: []string{"spec.key", "jwt applies only when source is JWTClaim"}},
	{name: "jwt: empty", mutate: byClaim(&v1alpha1.JWTVerification{}),
		wantErr: []string{"spec.key.jwt", "set issuer, audiences and jwks to verify tokens, or only insecureSkipVerification: VerifiedUpstream"}},
	{name: "jwt: no audiences", mutate: byClaim(&v1alpha1.JWTVerification{Issuer: "i", JWKS: &v1alpha1.JWKSSource{ConfigMapKey: "k"}}),
		wantErr: []string{"spec.key.jwt", "set issuer, audiences and jwks"}},
	{name: "jwt: empty audiences", mutate: byClaim(&v1alpha1.JWTVerification{Issuer: "i", Audiences: []string{}, JWKS: &v1alpha1.JWKSSource{ConfigMapKey: "k"}}),
		wantErr: []string{"spec.key.jwt", "set issuer, audiences and jwks"}},
	{name: "jwt: no jwks", mutate: byClaim(&v1alpha1.JWTVerification{Issuer: "i", Audiences: []string{"a"}}),
		wantErr: []string{"spec.key.jwt", "set issuer, audiences and jwks"}},
	{name: "jwt: verification and the opt-out", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
		j := verified()
		j.InsecureSkipVerification = v1alpha1.InsecureSkipVerificationVerifiedUpstream
		byClaim(j)(s)
	}, wantErr: []string{"spec.key.jwt", "or only insecureSkipVerification"}},
	{name: "jwt: opt-out without a reason", mutate: byClaim(&v1alpha1.JWTVerification{InsecureSkipVerification: "true"}),
		wantErr: []string{"spec.key.jwt.insecureSkipVerification", `supported values: "VerifiedUpstream"`}},
	{name: "jwt: both configMapKey and url", mutate: byClaim(&v1alpha1.JWTVerification{Issuer: "i", Audiences: []string{"a"},
		JWKS: &v1alpha1.JWKSSource{ConfigMapKey: "k", URL: "https://a.example/jwks"}}),
		wantErr: []string{"spec.key.jwt.jwks", "set exactly one of configMapKey"}},
	{name: "jwt: neither configMapKey nor url", mutate: byClaim(&v1alpha1.JWTVerification{Issuer: "i", Audiences: []string{"a"}, JWKS: &v1alpha1.JWKSSource{}}),
		wantErr: []string{"spec.key.jwt.jwks", "set exactly one of configMapKey"}},
	{name: "jwt: http url", mutate: byClaim(&v1alpha1.JWTVerification{Issuer: "i", Audiences: []string{"a"}, JWKS: &v1alpha1.JWKSSource{URL: "http://auth.example.com/jwks"}}),
		wantErr: []string{"spec.key.jwt.jwks.url", "url must be an https URL with a host"}},
	{name: "jwt: url without a host", mutate: byClaim(&v1alpha1.JWTVerification{Issuer: "i", Audiences: []string{"a"}, JWKS: &v1alpha1.JWKSSource{URL: "https:///jwks"}}),
		wantErr: []string{"spec.key.jwt.jwks.url", "url must be an https URL with a host"}},
	{name: "jwt: not a url", mutate: byClaim(&v1alpha1.JWTVerification{Issuer: "i", Audiences: []string{"a"}, JWKS: &v1alpha1.JWKSSource{URL: "auth.example.com/jwks"}}),
		wantErr: []string{"spec.key.jwt.jwks.url", "url must be an https URL with a host"}},
	{name: "jwt: url with credentials", mutate: byClaim(&v1alpha1.JWTVerification{Issuer: "i", Audiences: []string{"a"}, JWKS: &v1alpha1.JWKSSource{URL: "https://user:pw@auth.example.com/jwks"}}),
		wantErr: []string{"spec.key.jwt.jwks.url", "url must not carry credentials"}},
	{name: "jwt: configMapKey with a slash", mutate: byClaim(&v1alpha1.JWTVerification{Issuer: "i", Audiences: []string{"a"}, JWKS: &v1alpha1.JWKSSource{ConfigMapKey: "../secret"}}),
		wantErr: []string{"spec.key.jwt.jwks.configMapKey", "should match"}},
	{name: "jwt: 17 audiences", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
		j := verified()
		for i := range 16 {
			j.Audiences = append(j.Audiences, fmt.Sprintf("a%d", i))
		}
		byClaim(j)(s)
	}, wantErr: []string{"spec.key.jwt.audiences", "must have at most 16 items"}},
	{name: "jwt: issuer too long", mutate: func(s *v1alpha1.RateLimitPolicySpec) {
		j := verified()
		j.Issuer = strings.Repeat("i", 1025)
		byClaim(j)(s)
	}, wantErr: []string{"spec.key.jwt.issuer", "may not be more than 1024"}},
}

// TestStoredUnverifiedJWTPolicy is the migration of a JWTClaim policy
// stored before key.jwt existed: it stays readable, and an update that
// leaves its key alone is accepted (the API server ratchets the rule that
// JWTClaim needs jwt, since the key did not change); changing the key
// requires choosing verification or the explicit opt-out. The policy is
// stored through the CRD as it was (this one without the rule), then the
// CRD is restored.
func TestStoredUnverifiedJWTPolicy(t *testing.T) {
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := k.Get(ctx, client.ObjectKey{Name: "ratelimitpolicies.ratelimit.slidegate.dev"}, crd); err != nil {
		t.Fatal(err)
	}
	current := crd.DeepCopy()
	old := crd.DeepCopy()
	key := old.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["key"]
	var rules apiextensionsv1.ValidationRules
	for _, r := range key.XValidations {
		if !strings.HasPrefix(r.Message, "source JWTClaim needs jwt") {
			rules = append(rules, r)
		}
	}
	if len(rules) != len(key.XValidations)-1 {
		t.Fatalf("the rule that JWTClaim needs jwt is not in the CRD")
	}
	key.XValidations = rules
	old.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["key"] = key
	setCRD(t, old, true)
	t.Cleanup(func() { setCRD(t, current, false) })

	legacy := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "legacy-jwt", Namespace: "default"}, Spec: validSpec()}
	byClaim(nil)(&legacy.Spec)
	if err := k.Create(ctx, legacy); err != nil {
		t.Fatalf("storing a policy as the first release did: %v", err)
	}
	t.Cleanup(func() { _ = k.Delete(context.Background(), legacy) })
	setCRD(t, current, false)

	var got v1alpha1.RateLimitPolicy
	if err := k.Get(ctx, client.ObjectKeyFromObject(legacy), &got); err != nil {
		t.Fatalf("the stored policy is unreadable: %v", err)
	}
	got.Spec.Limit = 7
	if err := k.Update(ctx, &got); err != nil {
		t.Fatalf("an update that leaves the key alone: %v", err)
	}
	changed := got.DeepCopy()
	changed.Spec.Key.Name = "tenant"
	if err := k.Update(ctx, changed); err == nil || !strings.Contains(err.Error(), "source JWTClaim needs jwt") {
		t.Fatalf("an update of the key without jwt: %v", err)
	}
	changed.Spec.Key.JWT = verified()
	if err := k.Update(ctx, changed); err != nil {
		t.Fatalf("an update that adds jwt: %v", err)
	}
}

// setCRD updates the CRD to want and waits until the API server enforces
// its JWTClaim rule as want does (lax: not at all).
func setCRD(t *testing.T, want *apiextensionsv1.CustomResourceDefinition, lax bool) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var cur apiextensionsv1.CustomResourceDefinition
		err := k.Get(ctx, client.ObjectKeyFromObject(want), &cur)
		if err == nil {
			cur.Spec = want.Spec
			err = k.Update(ctx, &cur)
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("updating the CRD: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	probe := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "probe-jwt", Namespace: "default"}, Spec: validSpec()}
	byClaim(nil)(&probe.Spec)
	for {
		err := k.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		if (err == nil) == lax {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API server does not enforce the CRD's JWTClaim rule as wanted (lax %v): %v", lax, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
