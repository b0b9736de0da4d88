package redisidentity

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/redisadmin"
)

// TestDesiredUsersUnreadableNamespace: a namespace the manager cannot read
// (a forbidden or failed read of the API server) makes the periodic sync's
// desired state an error, so that the pass is skipped and Redis stays as
// it is. Before, the read's error was taken for "not opted in": the
// namespace's user was left out of the desired state, and the sync
// deleted it from Redis, taking Redis from every sidecar of the namespace
// at once (their fail-open fallback then admits each its own share). A
// namespace that is gone has no user, without an error.
func TestDesiredUsersUnreadableNamespace(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", UID: "uid-a",
		Labels: map[string]string{v1alpha1.InjectionLabel: v1alpha1.InjectionEnabled}}}
	policy := func(namespace string) *v1alpha1.RateLimitPolicy {
		return &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: namespace},
			Spec: v1alpha1.RateLimitPolicySpec{Window: "1s", Limit: 5}}
	}
	forbidden := apierrors.NewForbidden(corev1.Resource("namespaces"), "team-a", errors.New("no"))
	for _, tc := range []struct {
		name      string
		getErr    error
		policyNS  string
		wantUser  bool
		wantError bool
	}{
		{"readable", nil, "team-a", true, false},
		{"gone", nil, "team-gone", false, false},
		{"unreadable", forbidden, "team-a", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ns, policy(tc.policyNS)).Build()
			c := interceptor.NewClient(base, interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if _, ok := obj.(*corev1.Namespace); ok && tc.getErr != nil {
						return tc.getErr
					}
					return c.Get(ctx, key, obj, opts...)
				},
			})
			ri := &Identities{Client: c, Key: &InstallKey{Secret: types.NamespacedName{Namespace: "slidegate-system", Name: "slidegate-install"}, Reader: base, Writer: base}}
			users, err := ri.desiredUsers(context.Background())
			if (err != nil) != tc.wantError {
				t.Fatalf("desiredUsers: error %v, want an error: %t (users %d)", err, tc.wantError, len(users))
			}
			has := false
			for _, u := range users {
				has = has || u.Name == redisadmin.NamespaceUser("team-a")
			}
			if has != tc.wantUser {
				t.Errorf("desired users %v: team-a's user there: %t, want %t", users, has, tc.wantUser)
			}
		})
	}
}
