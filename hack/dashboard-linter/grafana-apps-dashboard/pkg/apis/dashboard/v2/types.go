// Package v2 declares the names dashboard-linter's v2 adapter (lint/v2.go) is compiled against. It is not
// Grafana's v2 schema: DashboardSpec refuses to be decoded, so the adapter reports an error for any v2
// dashboard. See ../../../../go.mod for why.
package v2

import "errors"

// ErrUnsupported is what decoding a v2 dashboard spec returns in this build.
var ErrUnsupported = errors.New("v2 (Kubernetes-shaped) dashboards are not supported by topoguard's build of " +
	"dashboard-linter: lint classic dashboard JSON")

type DashboardSpec struct {
	Title       string
	Editable    *bool
	Elements    map[string]DashboardElement
	Variables   []DashboardVariableKind
	Annotations []DashboardAnnotationQueryKind
}

// UnmarshalJSON refuses every v2 spec (see the package comment).
func (*DashboardSpec) UnmarshalJSON([]byte) error { return ErrUnsupported }

type DashboardElement struct {
	PanelKind *DashboardPanelKind
}

type DashboardPanelKind struct {
	Spec DashboardPanelSpec
}

type DashboardPanelSpec struct {
	Id          float64
	Title       string
	Description string
	VizConfig   DashboardVizConfigKind
	Data        DashboardQueryGroupKind
}

type DashboardVizConfigKind struct {
	Group string
	Spec  DashboardVizConfigSpec
}

type DashboardVizConfigSpec struct {
	FieldConfig map[string]interface{}
	Options     map[string]interface{}
}

type DashboardQueryGroupKind struct {
	Spec DashboardQueryGroupSpec
}

type DashboardQueryGroupSpec struct {
	Queries []DashboardPanelQueryKind
}

type DashboardPanelQueryKind struct {
	Spec DashboardPanelQuerySpec
}

type DashboardPanelQuerySpec struct {
	RefId  string
	Hidden bool
	Query  DashboardDataQueryKind
}

type DashboardDataQueryKind struct {
	Group      string
	Datasource *DashboardDatasourceRef
	Spec       map[string]interface{}
}

type DashboardDatasourceRef struct {
	Name *string
}

type DashboardVariableRefresh string

const (
	DashboardVariableRefreshNever              DashboardVariableRefresh = "never"
	DashboardVariableRefreshOnDashboardLoad    DashboardVariableRefresh = "onDashboardLoad"
	DashboardVariableRefreshOnTimeRangeChanged DashboardVariableRefresh = "onTimeRangeChanged"
)

type DashboardVariableKind struct {
	QueryVariableKind      *QueryVariableKind
	DatasourceVariableKind *DatasourceVariableKind
	CustomVariableKind     *StringVariableKind
	IntervalVariableKind   *StringVariableKind
	ConstantVariableKind   *StringVariableKind
	TextVariableKind       *StringVariableKind
	AdhocVariableKind      *StringVariableKind
	GroupByVariableKind    *StringVariableKind
	SwitchVariableKind     *StringVariableKind
}

type QueryVariableKind struct {
	Spec QueryVariableSpec
}

type QueryVariableSpec struct {
	Name     string
	Label    *string
	Multi    bool
	AllValue *string
	Refresh  DashboardVariableRefresh
	Query    DashboardDataQueryKind
}

type DatasourceVariableKind struct {
	Spec DatasourceVariableSpec
}

type DatasourceVariableSpec struct {
	Name     string
	Label    *string
	Multi    bool
	AllValue *string
	Refresh  DashboardVariableRefresh
	PluginId string
}

type StringVariableKind struct {
	Spec StringVariableSpec
}

type StringVariableSpec struct {
	Name     string
	Label    *string
	Multi    bool
	AllValue *string
	Query    string
}

type DashboardAnnotationQueryKind struct {
	Spec DashboardAnnotationQuerySpec
}

type DashboardAnnotationQuerySpec struct {
	Name  string
	Query DashboardDataQueryKind
}
