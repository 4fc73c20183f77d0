// Command oracle answers `topoguard reach` questions with Cilium's own policy code.
//
// It reads one case per line (JSON) on stdin and writes one answer per line on stdout, in order.
// A case holds the policy objects as the apiserver stores them (CiliumNetworkPolicy,
// CiliumClusterwideNetworkPolicy, NetworkPolicy, ClusterNetworkPolicy), the two pods as policy sees
// them, the destination ports and protocol, and the agent settings the answer depends on.
//
// What it drives, all from github.com/cilium/cilium v1.20.2 (each function is called, none is
// copied):
//
//   - pkg/k8s/apis/cilium.io/v2 CiliumNetworkPolicy.Parse / CiliumClusterwideNetworkPolicy.Parse
//     (Sanitize + ParseToCiliumRule) and pkg/policy/utils.RulesToPolicyEntries, as
//     pkg/policy/k8s upsertCiliumNetworkPolicyV2 does;
//   - pkg/k8s.ParseNetworkPolicy and pkg/k8s.ParseClusterNetworkPolicy, as
//     pkg/policy/k8s addK8sNetworkPolicyV1 / addK8sClusterNetworkPolicy do;
//   - pkg/k8s/utils.SanitizePodLabels and pkg/labelsfilter.Filter (ParseLabelPrefixCfg for a
//     custom `labels` setting) to build each pod's security identity;
//   - policy.NewPolicyRepository (with pkg/envoy/policy.NewEnvoyL7RulesTranslator and a
//     pkg/types.NamedPortMultiMap of the destination's ports as its NamedPortsGetter),
//     Repository.MustAddPolicyEntries and policy.LookupFlow, the flow lookup Cilium's own tests
//     use (pkg/k8s/network_policy_test.go testNewPolicyRepository);
//   - pkg/policy/api.InitEntities for the `cluster` entity of the cluster name.
//
// The answer per case is allow or deny (Cilium has no third verdict), plus the policies Cilium
// rejected (not imported) with the parse error.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	policyv1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	envoypolicy "github.com/cilium/cilium/pkg/envoy/policy"
	"github.com/cilium/cilium/pkg/identity"
	"github.com/cilium/cilium/pkg/identity/identitymanager"
	"github.com/cilium/cilium/pkg/k8s"
	cilium_v2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	slim_corev1 "github.com/cilium/cilium/pkg/k8s/slim/k8s/api/core/v1"
	slim_networkingv1 "github.com/cilium/cilium/pkg/k8s/slim/k8s/api/networking/v1"
	slim_metav1 "github.com/cilium/cilium/pkg/k8s/slim/k8s/apis/meta/v1"
	k8sUtils "github.com/cilium/cilium/pkg/k8s/utils"
	"github.com/cilium/cilium/pkg/labels"
	"github.com/cilium/cilium/pkg/labelsfilter"
	"github.com/cilium/cilium/pkg/option"
	"github.com/cilium/cilium/pkg/policy"
	"github.com/cilium/cilium/pkg/policy/api"
	policytypes "github.com/cilium/cilium/pkg/policy/types"
	policyutils "github.com/cilium/cilium/pkg/policy/utils"
	testidentity "github.com/cilium/cilium/pkg/testutils/identity"
	testpolicy "github.com/cilium/cilium/pkg/testutils/policy"
	pkgtypes "github.com/cilium/cilium/pkg/types"
	"github.com/cilium/cilium/pkg/u8proto"
)

// Pod is one side of the flow.
type Pod struct {
	Namespace          string            `json:"namespace"`
	Labels             map[string]string `json:"labels"`
	NamespaceLabels    map[string]string `json:"namespaceLabels"`
	ServiceAccountName string            `json:"serviceAccountName"`
	ContainerPorts     []ContainerPort   `json:"containerPorts"`
}

// ContainerPort is a named container port of the destination.
type ContainerPort struct {
	Name          string `json:"name"`
	ContainerPort uint16 `json:"containerPort"`
	Protocol      string `json:"protocol"`
}

// Settings are the agent settings a verdict depends on.
type Settings struct {
	PolicyEnforcement string   `json:"policyEnforcement"` // default | always | never
	ClusterName       string   `json:"clusterName"`       // default "default"
	Labels            []string `json:"labels"`            // cilium-config `labels`: extra identity label prefixes
}

// Case is one question.
type Case struct {
	Name     string            `json:"name"`
	Policies []json.RawMessage `json:"policies"`
	Src      Pod               `json:"src"`
	Dst      Pod               `json:"dst"`
	Ports    []uint16          `json:"ports"`
	Protocol string            `json:"protocol"`
	Settings Settings          `json:"settings"`
}

// Answer is Cilium's verdict for one case.
type Answer struct {
	Name     string   `json:"name"`
	Verdict  string   `json:"verdict"` // allow | deny | error
	Egress   string   `json:"egress,omitempty"`
	Ingress  string   `json:"ingress,omitempty"`
	Denied   []string `json:"denied,omitempty"` // "TCP/80 egress" for every port that is not allowed
	Rejected []string `json:"rejected,omitempty"`
	Error    string   `json:"error,omitempty"`
}

var logger = slog.New(slog.NewTextHandler(io.Discard, nil))

func main() {
	// The agent defaults the oracle assumes besides the per-case settings.
	option.Config.EnableL7Proxy = true
	option.Config.EnableNodeSelectorLabels = true

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		var c Case
		var ans Answer
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			ans = Answer{Verdict: "error", Error: "bad case: " + err.Error()}
		} else {
			ans = answer(c)
		}
		if err := enc.Encode(ans); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}

func answer(c Case) (ans Answer) {
	ans.Name = c.Name
	defer func() {
		if os.Getenv("ORACLE_DEBUG") != "" {
			return // let a panic show its stack
		}
		if r := recover(); r != nil {
			ans = Answer{Name: c.Name, Verdict: "error", Error: fmt.Sprintf("panic: %v", r)}
		}
	}()
	settings := c.Settings
	if settings.ClusterName == "" {
		settings.ClusterName = "default"
	}
	if settings.PolicyEnforcement == "" {
		settings.PolicyEnforcement = option.DefaultEnforcement
	}
	policy.SetPolicyEnabled(settings.PolicyEnforcement)
	if err := labelsfilter.ParseLabelPrefixCfg(logger, settings.Labels, nil, ""); err != nil {
		return Answer{Name: c.Name, Verdict: "error", Error: "labels: " + err.Error()}
	}

	// The `cluster` entity selects the local cluster's name, as the agent sets it at start.
	api.InitEntities(settings.ClusterName)

	src := podIdentity(1001, c.Src, settings.ClusterName)
	dst := podIdentity(1002, c.Dst, settings.ClusterName)
	idManager, repo := newRepository(src, dst)
	// Egress port names resolve per destination identity (the ipcache's named ports in the agent).
	repo.SetNamedPortsGetter(namedPorts(dst.ID, c.Dst.ContainerPorts))
	for i, raw := range c.Policies {
		entries, name, err := parsePolicy(raw, settings.ClusterName)
		if err != nil {
			ans.Rejected = append(ans.Rejected, fmt.Sprintf("policies[%d] %s: %v", i, name, err))
			continue
		}
		repo.MustAddPolicyEntries(entries)
	}

	named := map[string]uint16{}
	namedUDP := map[string]uint16{}
	for _, p := range c.Dst.ContainerPorts {
		if p.Name == "" {
			continue
		}
		switch strings.ToUpper(p.Protocol) {
		case "", "TCP":
			named[p.Name] = p.ContainerPort
		case "UDP":
			namedUDP[p.Name] = p.ContainerPort
		}
	}
	protocols := []u8proto.U8proto{u8proto.TCP}
	switch strings.ToUpper(c.Protocol) {
	case "UDP":
		protocols = []u8proto.U8proto{u8proto.UDP}
	case "SCTP":
		protocols = []u8proto.U8proto{u8proto.SCTP}
	case "ANY":
		protocols = []u8proto.U8proto{u8proto.TCP, u8proto.UDP, u8proto.SCTP}
	}
	egressOK, ingressOK := true, true
	for _, proto := range protocols {
		for _, port := range c.Ports {
			flow := policytypes.Flow{From: src, To: dst, Proto: proto, Dport: port, NamedPortsTCP: named, NamedPortsUDP: namedUDP}
			verdict, _, _, err := policy.LookupFlow(logger, repo, idManager, flow)
			if err != nil {
				return Answer{Name: c.Name, Verdict: "error", Error: err.Error(), Rejected: ans.Rejected}
			}
			if verdict.Egress == policytypes.DecisionDenied {
				egressOK = false
				ans.Denied = append(ans.Denied, fmt.Sprintf("%s/%d egress", proto, port))
			}
			if verdict.Ingress == policytypes.DecisionDenied {
				ingressOK = false
				ans.Denied = append(ans.Denied, fmt.Sprintf("%s/%d ingress", proto, port))
			}
		}
	}
	ans.Egress, ans.Ingress = word(egressOK), word(ingressOK)
	ans.Verdict = word(egressOK && ingressOK)
	return ans
}

func word(ok bool) string {
	if ok {
		return "allow"
	}
	return "deny"
}

// podIdentity is the security identity the agent gives a pod: SanitizePodLabels (namespace, its
// labels, service account, cluster) over the pod's own labels, then the identity label filter.
func podIdentity(id identity.NumericIdentity, pod Pod, clusterName string) *identity.Identity {
	nsLabels := map[string]string{"kubernetes.io/metadata.name": pod.Namespace}
	for k, v := range pod.NamespaceLabels {
		nsLabels[k] = v
	}
	ns := &slim_corev1.Namespace{ObjectMeta: slim_metav1.ObjectMeta{Name: pod.Namespace, Labels: nsLabels}}
	podLabels := map[string]string{}
	for k, v := range pod.Labels {
		podLabels[k] = v
	}
	sa := pod.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	all := k8sUtils.SanitizePodLabels(podLabels, ns, sa, clusterName)
	kept, _ := labelsfilter.Filter(labels.Map2Labels(all, labels.LabelSourceK8s))
	return identity.NewIdentity(id, kept)
}

// newRepository is an empty policy repository that knows both identities, set up the way
// pkg/k8s/network_policy_test.go testNewPolicyRepository does.
func newRepository(ids ...*identity.Identity) (identitymanager.IDManager, *policy.Repository) {
	idmap := identity.IdentityMap{}
	for _, id := range ids {
		idmap[id.ID] = id.LabelArray
	}
	idManager := identitymanager.NewIDManager(logger)
	// The agent's own L7 translator (pkg/envoy/policy), so an http rule resolves to a proxy
	// redirect, which the flow lookup reports as allowed at L3/L4; no secrets (no TLS rules).
	translator := envoypolicy.NewEnvoyL7RulesTranslator(logger, nil)
	repo := policy.NewPolicyRepository(logger, idmap, nil, translator, idManager, testpolicy.NewPolicyMetricsNoop())
	repo.GetSelectorCache().SetLocalIdentityNotifier(testidentity.NewDummyIdentityNotifier())
	idManager.Subscribe(testpolicy.SelectorCacheObserver{Cache: repo.GetSubjectSelectorCache()})
	return idManager, repo
}

// namedPortsOf is what the agent's ipcache knows of port names: here, the destination's.
type namedPortsOf struct{ m pkgtypes.NamedPortMultiMap }

func (n namedPortsOf) GetNamedPorts() pkgtypes.NamedPortMultiMap { return n.m }

func namedPorts(id identity.NumericIdentity, ports []ContainerPort) namedPortsOf {
	m := pkgtypes.NewNamedPortMultiMap()
	named := pkgtypes.NamedPortMap{}
	for _, p := range ports {
		if p.Name == "" || p.ContainerPort == 0 {
			continue
		}
		proto := u8proto.TCP
		switch strings.ToUpper(p.Protocol) {
		case "UDP":
			proto = u8proto.UDP
		case "SCTP":
			proto = u8proto.SCTP
		}
		named[strings.ToLower(p.Name)] = pkgtypes.PortProto{Proto: proto, Port: p.ContainerPort}
	}
	m.Update(id, nil, named)
	return namedPortsOf{m}
}

type typeMeta struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

// parsePolicy turns one stored object into policy entries the way the agent's watchers do.
func parsePolicy(raw json.RawMessage, clusterName string) (policytypes.PolicyEntries, string, error) {
	var meta typeMeta
	if err := json.Unmarshal(raw, &meta); err != nil {
		return nil, "", err
	}
	name := meta.Kind + " " + strings.TrimPrefix(meta.Metadata.Namespace+"/"+meta.Metadata.Name, "/")
	switch meta.Kind {
	case "CiliumNetworkPolicy":
		var cnp cilium_v2.CiliumNetworkPolicy
		if err := json.Unmarshal(raw, &cnp); err != nil {
			return nil, name, err
		}
		if cnp.Namespace == "" {
			cnp.Namespace = "default"
		}
		rules, err := cnp.Parse(logger, clusterName)
		if err != nil {
			return nil, name, err
		}
		return policyutils.RulesToPolicyEntries(rules), name, nil
	case "CiliumClusterwideNetworkPolicy":
		var ccnp cilium_v2.CiliumClusterwideNetworkPolicy
		if err := json.Unmarshal(raw, &ccnp); err != nil {
			return nil, name, err
		}
		rules, err := ccnp.Parse(logger, clusterName)
		if err != nil {
			return nil, name, err
		}
		return policyutils.RulesToPolicyEntries(rules), name, nil
	case "NetworkPolicy":
		var np slim_networkingv1.NetworkPolicy
		if err := json.Unmarshal(raw, &np); err != nil {
			return nil, name, err
		}
		if np.Namespace == "" {
			np.Namespace = "default"
		}
		entries, err := k8s.ParseNetworkPolicy(logger, clusterName, &np)
		return entries, name, err
	case "ClusterNetworkPolicy":
		var kcnp policyv1alpha2.ClusterNetworkPolicy
		if err := json.Unmarshal(raw, &kcnp); err != nil {
			return nil, name, err
		}
		entries, err := k8s.ParseClusterNetworkPolicy(logger, clusterName, &kcnp)
		return entries, name, err
	}
	return nil, name, fmt.Errorf("kind %q is not a policy kind", meta.Kind)
}

