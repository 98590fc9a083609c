// Command celcost prints the CEL cost estimate of every x-kubernetes-validations rule of the CRDs on its
// standard input (YAML or JSON, several documents), computed by k8s.io/apiextensions-apiserver v0.35.4's
// own code, as JSON on standard output.
//
// kube-apiserver estimates the cost when it validates a CRD (pkg/apis/apiextensions/validation/
// validation.go ValidateCustomResourceDefinitionOpenAPISchema): for each schema node with rules it takes
// the node's CEL type (CELSchemaContext.TypeInfo), compiles the rules (pkg/apiserver/schema/cel.Compile,
// with celconfig.PerCallLimit and the base environment of the default compatibility version), multiplies
// each rule's MaxCost by how often the node can occur (getExpressionCost: the product of the maxItems and
// maxProperties above it, or the compiler's own cardinality when one of them is unbounded) and adds it to
// the CRD's TotalCost. That function does not return the costs, only errors past the limits
// (StaticEstimatedCostLimit per rule, StaticEstimatedCRDCostLimit per CRD version), so this walk repeats
// its descent (properties, items, additionalProperties, each through the exported CELSchemaContext
// child constructors) and its three lines of arithmetic, and also runs ValidateCustomResourceDefinition
// itself, whose errors it reports: the server's verdict next to the numbers.
//
// Usage: python -m controller crds | celcost
// Exit codes: 0 the costs were printed (also when the server would refuse a CRD: see "errors"),
// 1 the input is not a CRD list.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
)

type rule struct {
	Path        string `json:"path"`
	Rule        string `json:"rule"`
	Cost        uint64 `json:"cost"`
	MaxCost     uint64 `json:"maxCost"`
	Cardinality uint64 `json:"cardinality"`
	// MessageExpressionCost is the estimate of the rule's messageExpression (0 without one).
	MessageExpressionCost uint64 `json:"messageExpressionCost"`
}

type version struct {
	CRD     string   `json:"crd"`
	Version string   `json:"version"`
	Total   uint64   `json:"total"`
	Rules   []rule   `json:"rules"`
	Errors  []string `json:"errors"`
}

type report struct {
	RuleLimit uint64    `json:"ruleLimit"`
	CRDLimit  uint64    `json:"crdLimit"`
	Versions  []version `json:"versions"`
}

func main() {
	out, err := run(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "celcost.failed error=%q\n", err.Error())
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		os.Exit(1)
	}
}

func run(in io.Reader) (*report, error) {
	out := &report{RuleLimit: validation.StaticEstimatedCostLimit, CRDLimit: validation.StaticEstimatedCRDCostLimit}
	dec := utilyaml.NewYAMLOrJSONDecoder(in, 4096)
	for {
		var v1 apiextensionsv1.CustomResourceDefinition
		if err := dec.Decode(&v1); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, err
		}
		if v1.Kind == "" {
			continue // an empty document
		}
		if v1.Kind != "CustomResourceDefinition" {
			return nil, fmt.Errorf("not a CustomResourceDefinition: %s %s", v1.Kind, v1.Name)
		}
		// As the server reads a v1 CRD: defaulted, then converted to the internal type it validates.
		apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(&v1)
		var crd apiextensions.CustomResourceDefinition
		if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&v1, &crd, nil); err != nil {
			return nil, err
		}
		var refusals []string
		for _, e := range validation.ValidateCustomResourceDefinition(context.Background(), &crd) {
			refusals = append(refusals, e.Error())
		}
		for _, v := range crd.Spec.Versions {
			s := crd.Spec.Validation
			if v.Schema != nil {
				s = v.Schema
			}
			if s == nil || s.OpenAPIV3Schema == nil {
				continue
			}
			ctx := validation.RootCELContext(s.OpenAPIV3Schema)
			rules, err := walk(s.OpenAPIV3Schema, ctx, "openAPIV3Schema")
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", crd.Name, v.Name, err)
			}
			sort.Slice(rules, func(i, j int) bool { return rules[i].Cost > rules[j].Cost })
			out.Versions = append(out.Versions, version{
				CRD: crd.Name, Version: v.Name, Total: ctx.TotalCost.Total, Rules: rules, Errors: refusals,
			})
		}
	}
	return out, nil
}

// walk follows ValidateCustomResourceDefinitionOpenAPISchema's descent with the CEL context it passes down.
func walk(s *apiextensions.JSONSchemaProps, ctx *validation.CELSchemaContext, path string) ([]rule, error) {
	var out []rule
	if len(s.XValidations) > 0 {
		info, err := ctx.TypeInfo()
		if err != nil || info == nil {
			return nil, fmt.Errorf("%s: no CEL type information (%v)", path, err)
		}
		envSet := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
		results, err := cel.Compile(info.Schema, info.DeclType, celconfig.PerCallLimit, envSet, cel.NewExpressionsEnvLoader())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for i, cr := range results {
			if cr.Error != nil {
				return nil, fmt.Errorf("%s x-kubernetes-validations[%d]: %s", path, i, cr.Error.Detail)
			}
			// validation.go getExpressionCost.
			cardinality := cr.MaxCardinality
			if ctx.MaxCardinality != nil {
				cardinality = *ctx.MaxCardinality
			}
			cost := multiply(cr.MaxCost, cardinality)
			rulePath := fmt.Sprintf("%s.x-kubernetes-validations[%d].rule", path, i)
			ctx.TotalCost.Total = add(ctx.TotalCost.Total, cost)
			if cr.MessageExpression != nil {
				ctx.TotalCost.Total = add(ctx.TotalCost.Total, cr.MessageExpressionMaxCost)
			}
			out = append(out, rule{
				Path: rulePath, Rule: s.XValidations[i].Rule, Cost: cost, MaxCost: cr.MaxCost,
				Cardinality: cardinality, MessageExpressionCost: cr.MessageExpressionMaxCost,
			})
		}
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		sub, err := walk(s.AdditionalProperties.Schema, ctx.ChildAdditionalPropertiesContext(s.AdditionalProperties.Schema), path+".additionalProperties")
		if err != nil {
			return nil, err
		}
		out = append(out, sub...)
	}
	names := make([]string, 0, len(s.Properties))
	for name := range s.Properties {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := s.Properties[name]
		sub, err := walk(&p, ctx.ChildPropertyContext(&p, name), path+".properties."+name)
		if err != nil {
			return nil, err
		}
		out = append(out, sub...)
	}
	if s.Items != nil && s.Items.Schema != nil {
		sub, err := walk(s.Items.Schema, ctx.ChildItemsContext(s.Items.Schema), path+".items")
		if err != nil {
			return nil, err
		}
		out = append(out, sub...)
	}
	return out, nil
}

// multiply and add saturate at MaxUint64 as validation.go multiplyWithOverflowGuard and
// TotalCost.ObserveExpressionCost do.
func multiply(a, b uint64) uint64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxUint64/b {
		return math.MaxUint64
	}
	return a * b
}

func add(a, b uint64) uint64 {
	if math.MaxUint64-a < b {
		return math.MaxUint64
	}
	return a + b
}
